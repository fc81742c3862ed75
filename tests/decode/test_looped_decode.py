"""A scanned stack decodes by a loop over its layers with `decode_layers='loop'`: each layer's
params sliced from the stack inside the program, a cache of its own, a local layer's the ring of
its window. Its greedy tokens equal the unrolled model's of the same weights bitwise, for plain,
mixed local/global and MoE stacks; 'scan' keeps one stacked cache, and 'unrolled' (the
default) splits the params per layer first (tests/decode/test_local_cache.py)."""

import numpy as np
import pytest

from paxlike.decode import generate
from paxlike.layers import TransformerLM, lm_checks, stack_layers
from tests.decode.test_generate import params_of, prompts_of, recompute_greedy
from tests.decode.test_local_cache import CACHE, GEMMA2, GEMMA2_MOE, GEMMA3, WINDOW, cache_shapes

LLAMA = dict(vocab_size=64, num_layers=3, d_model=32, num_heads=4, num_kv_heads=2, d_ff=64,
             max_len=CACHE)


@pytest.mark.parametrize('fields', [LLAMA, GEMMA2, GEMMA3, GEMMA2_MOE],
                         ids=['llama', 'gemma2', 'gemma3', 'moe'])
def test_a_looped_stack_decodes_as_its_unrolled_model_with_a_cache_per_layer(fields):
  model = TransformerLM(**fields)
  params = params_of(model)
  group = model.moe_every if model.num_experts else 1
  looped = model.clone(scan_layers=True, decode_layers='loop')
  stacked = stack_layers(params, model.num_layers, group)
  slots = {name: shape[2] for name, shape in cache_shapes(looped, stacked, 6).items()}
  windowed = [bool(model.sliding_window) and model.is_local_layer(i)
              for i in range(model.num_layers)]
  assert slots == {f'layer_{i}': WINDOW if w else CACHE for i, w in enumerate(windowed)}
  prompts = prompts_of([3, 9, 1], seed=5)
  got = generate(looped, stacked, prompts, max_new_tokens=10, cache_len=CACHE)
  want = generate(model, params, prompts, max_new_tokens=10, cache_len=CACHE)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)
  np.testing.assert_array_equal(got[0], recompute_greedy(model, params, prompts[0], 10))


def test_unrolled_is_the_default_and_scan_keeps_one_stacked_cache():
  scanned = TransformerLM(**GEMMA2, scan_layers=True)
  stacked = params_of(scanned)
  assert scanned.decode_layers == 'unrolled' and not scanned.loops_to_decode()
  assert list(cache_shapes(scanned.clone(decode_layers='scan'), stacked, 6)) == ['blocks']
  assert scanned.clone(decode_layers='loop').loops_to_decode()
  assert not TransformerLM(**GEMMA2, decode_layers='loop').loops_to_decode()  # Not scanned.


def test_an_unknown_way_to_decode_is_refused():
  with pytest.raises(ValueError, match="decode_layers must be one of unrolled, scan, loop"):
    lm_checks.check_model(TransformerLM(**LLAMA, scan_layers=True, decode_layers='unroll'), 8)
