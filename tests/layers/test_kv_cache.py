"""The attention layer's KV cache (layers/kv_cache.py, CausalSelfAttention(decode=True)): a
prefill then one token at a time gives, at every position, the output of the whole sequence
computed at once without a cache. A cache written one slot off fails here."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.layers import kv_cache
from paxlike.layers.attention import CausalSelfAttention

B, T, D, PREFILL, CACHE = 2, 12, 16, 5, 16
VARIANTS = {
    'rope_gqa': dict(num_heads=4, num_kv_heads=2),
    'window_mqa_qk_norm': dict(num_heads=4, num_kv_heads=1, sliding_window=3, qk_norm=True),
}


def layer_and_inputs(variant: str):
  layer = CausalSelfAttention(head_dim=8, implementation='xla', **VARIANTS[variant])
  x = jax.random.normal(jax.random.key(1), (B, T, D), jnp.float32)
  params = nn.unbox(jax.jit(layer.init)(jax.random.key(0), x))['params']
  return layer, params, x


def cached_outputs(layer, params, x: jax.Array) -> np.ndarray:
  """[B, T, D]: the first PREFILL positions in one decode call, then one position per call,
  each at its own rope position."""
  positions = jnp.broadcast_to(jnp.arange(T), (B, T))
  prefill = jax.jit(lambda p, x, pos: layer.apply(
      {'params': p}, x, positions=pos, decode=True, cache_len=CACHE, mutable=['cache']))
  step = jax.jit(lambda p, cache, x, pos: layer.apply(
      {'params': p, **cache}, x, positions=pos, decode=True, mutable=['cache']))
  out, cache = prefill(params, x[:, :PREFILL], positions[:, :PREFILL])
  outs = [out]
  for t in range(PREFILL, T):
    out, cache = step(params, cache, x[:, t:t + 1], positions[:, t:t + 1])
    outs.append(out)
  assert int(cache['cache']['index']) == T
  return np.asarray(jnp.concatenate(outs, axis=1))


@pytest.mark.parametrize('variant', VARIANTS)
def test_cached_decode_equals_the_full_sequence_position_by_position(variant):
  layer, params, x = layer_and_inputs(variant)
  full = np.asarray(jax.jit(layer.apply)({'params': params}, x))
  np.testing.assert_allclose(cached_outputs(layer, params, x), full, rtol=1e-5, atol=1e-5)


def test_a_cache_written_one_slot_off_is_caught(monkeypatch):
  layer, params, x = layer_and_inputs('rope_gqa')
  full = np.asarray(jax.jit(layer.apply)({'params': params}, x))
  write = kv_cache.write
  monkeypatch.setattr(kv_cache, 'write',
                      lambda cache, new, index, axis: write(cache, new, index + 1, axis))
  off = cached_outputs(layer, params, x)
  assert not np.allclose(off[:, PREFILL:], full[:, PREFILL:], rtol=1e-3, atol=1e-3)
