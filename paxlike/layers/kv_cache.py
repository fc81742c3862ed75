"""The decoding KV cache of one attention layer: pure functions to write it and attend over it.

The cache holds `key` and `value` [B, K, L, H] (kv heads before slots: the layout XLA's batched
matmuls read without transposing the whole cache each step), the `segment_ids` [B, L] of the
tokens written so far (0 for left padding) and the `index` of the next free slot. A decode call
writes its T tokens at slots [index, index + T). A query at slot s sees the keys at slots <= s
(unwritten slots lie beyond it) of its own segment and, with a sliding window W, only the W - 1
slots before s. Prompts are left-padded, so each row's real tokens are contiguous and slot
distance equals position distance.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# Logical axes of the cached keys and values: those of the kv activations.
CACHE_AXES = ('batch', 'kv_heads', 'length', 'kv')


def write(cache: jax.Array, new: jax.Array, index: jax.Array, axis: int) -> jax.Array:
  """`cache` with `new` (the same shape but T along `axis`) written at slots
  [index, index + T) of `axis`."""
  return jax.lax.dynamic_update_slice_in_dim(cache, new.astype(cache.dtype), index, axis=axis)


def decode_mask(q_segments: jax.Array, k_segments: jax.Array, index: jax.Array,
                sliding_window: int | jax.Array | None) -> jax.Array:
  """bool [B, T, L]: which cache slots each of the T queries written at `index` sees (the
  window may be traced: a scanned step's layer picks its own)."""
  t, cache_len = q_segments.shape[1], k_segments.shape[1]
  q_slot = index + jnp.arange(t)[:, None]
  k_slot = jnp.arange(cache_len)[None, :]
  allowed = k_slot <= q_slot
  if sliding_window is not None:
    allowed &= q_slot - k_slot < sliding_window
  same = q_segments[:, :, None] == k_segments[:, None, :]
  return same & allowed[None]


def attend(q: jax.Array, keys: jax.Array, values: jax.Array, mask: jax.Array,
           scale: float | None = None, softcap: float | None = None) -> jax.Array:
  """Grouped-query attention of q [B, T, N, H] over the cache's keys and values [B, K, L, H]
  where `mask` [B, T, L] allows; softmax in float32, scores times `scale` (None: 1/sqrt(H)),
  soft-capped to ±`softcap` when set. -> [B, T, N, H]."""
  b, t, n, h = q.shape
  kv = keys.shape[1]
  grouped = q.reshape(b, t, kv, n // kv, h)
  scores = jnp.einsum('btkgh,bklh->bkgtl', grouped, keys, preferred_element_type=jnp.float32)
  scores = scores * np.float32(h ** -0.5 if scale is None else scale)
  if softcap is not None:
    scores = jnp.tanh(scores / softcap) * softcap
  scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(values.dtype)
  # In the dot's own output order, then moved: with T = 1 the move is free, where asking the
  # dot for [B, T, K, G, H] made XLA transpose the output projection's weight every step.
  out = jnp.einsum('bkgtl,bklh->bkgth', probs, values)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)
