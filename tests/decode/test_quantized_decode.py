"""Weight-only quantized decode: a LoRA model over an int8 or NF4 base decodes with its adapters
kept beside the quantized kernels, and samples what the float model with the adapters merged
into the dequantized base samples."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.decode import generate
from paxlike.layers import TransformerLM, lora, quantization

FLOAT = TransformerLM(vocab_size=64, num_layers=2, d_model=128, num_heads=2, d_ff=128,
                      max_len=48, lora_rank=4, lora_targets=('query', 'value', 'wo'))


@pytest.mark.parametrize('kind', ['int8', 'nf4'])
def test_quantized_lora_decode_equals_the_merged_dequantized_model(kind):
  tokens = jnp.zeros((1, 8), jnp.int32)
  params = nn.unbox(jax.jit(FLOAT.init)(jax.random.key(0), tokens))['params']
  # Adapters that change the function (B starts at zero).
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x + 0.05 if str(path[-1].key).endswith('_lora_b') else x, params)
  model = FLOAT.clone(base_quantization=kind)
  qparams = quantization.quantize_tree(params, kind)
  merged = lora.merge_lora(quantization.dequantize_tree(qparams), FLOAT)
  plain = FLOAT.clone(lora_rank=0)
  prompts = [np.arange(1, 9, dtype=np.int32), np.arange(20, 25, dtype=np.int32)]
  got = generate(model, qparams, prompts, max_new_tokens=12)
  want = generate(plain, merged, prompts, max_new_tokens=12)
  assert [g.tolist() for g in got] == [w.tolist() for w in want]
  assert all(len(g) == 12 for g in got)
