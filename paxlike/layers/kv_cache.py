"""Pure helpers of the decoding KV cache: writing new slots and the mask over the cache.

The cache of one attention layer holds `key` and `value` [B, L, K, H], the `segment_ids` [B, L]
of the tokens written so far (0 for left padding) and the `index` of the next free slot. A
decode call writes its T tokens at slots [index, index + T). A query at slot s sees the keys at
slots <= s (unwritten slots lie beyond it) of its own segment, and within a sliding window of
W the W - 1 slots before s. Prompts are left-padded, so each row's real tokens are contiguous
and slot distance equals position distance.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def write(cache: jax.Array, new: jax.Array, index: jax.Array) -> jax.Array:
  """`cache` [B, L, ...] with `new` [B, T, ...] written at slots [index, index + T)."""
  return jax.lax.dynamic_update_slice_in_dim(cache, new.astype(cache.dtype), index, axis=1)


def decode_mask(q_segments: jax.Array, k_segments: jax.Array, index: jax.Array,
                sliding_window: int | None) -> jax.Array:
  """bool [B, 1, T, L]: which cache slots each of the T queries written at `index` sees."""
  t, cache_len = q_segments.shape[1], k_segments.shape[1]
  q_slot = index + jnp.arange(t)[:, None]
  k_slot = jnp.arange(cache_len)[None, :]
  allowed = k_slot <= q_slot
  if sliding_window is not None:
    allowed &= q_slot - k_slot < sliding_window
  same = q_segments[:, :, None] == k_segments[:, None, :]
  return (same & allowed[None])[:, None]
