"""A LoRA rank larger than the projection it adapts is refused, naming both sizes."""

import jax
import numpy as np
import pytest

from paxlike.layers import TransformerLM


def init(**fields):
  model = TransformerLM(vocab_size=64, num_layers=1, d_model=32, num_heads=4, d_ff=48, **fields)
  return model.init(jax.random.key(0), np.zeros((1, 4), np.int32))


def test_a_rank_past_the_smaller_side_of_a_projection_is_refused():
  with pytest.raises(ValueError, match=r'lora_rank=40 is larger than the query projection it '
                                       r'adapts \(32 -> 32\); use at most 32'):
    init(lora_rank=40, lora_targets=('query',))
  with pytest.raises(ValueError, match=r'lora_rank=40 is larger than the wo projection it '
                                       r'adapts \(48 -> 32\)'):
    init(lora_rank=40, lora_targets=('wo',))


def test_a_rank_equal_to_the_smaller_side_is_allowed():
  params = init(lora_rank=32, lora_targets=('query', 'wo'))['params']
  assert params['block_0']['attention']['query_lora_a'].value.shape == (32, 32)
