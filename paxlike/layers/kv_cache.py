"""The decoding KV cache of one attention layer: pure functions to write it and attend over it.

The cache holds `key` and `value` [B, K, L, H] (kv heads before slots: the layout XLA's batched
matmuls read without transposing the whole cache each step), the `segment_ids` [B, L] of the
tokens written so far (0 for left padding) and the `index` of the next free slot. A decode call
writes its T tokens at slots [index, index + T). A query at slot s sees the keys at slots <= s
(unwritten slots lie beyond it) of its own segment and, with a sliding window W, only the W - 1
slots before s. Prompts are left-padded, so each row's real tokens are contiguous and slot
distance equals position distance.

A local layer (a static sliding window W) keeps a ring of S = min(W, cache length) slots
instead: absolute slot p lives in entry p mod S, and a call attends over the ring as it was
(`ring_slots` says which absolute slot each entry holds) followed by its own T new keys, then
writes the last min(T, S) of them into the ring. A query at p >= index needs slots > p - W >=
index - W, which the ring's last S written slots hold, so it sees exactly what the full cache
shows it.
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


def ring_write(ring: jax.Array, new: jax.Array, index: jax.Array, axis: int) -> jax.Array:
  """`ring` (S entries along `axis`) with the last min(T, S) of `new`'s T slots (absolute
  [index, index + T)) written at their entries, slot mod S."""
  size, t = ring.shape[axis], new.shape[axis]
  kept = min(t, size)
  tail = jax.lax.slice_in_dim(new, t - kept, t, axis=axis).astype(ring.dtype)
  entries = jnp.mod(index + t - kept + jnp.arange(kept), size)
  if kept == 1:  # A decode step: one in-place slice update.
    return write(ring, tail, entries[0], axis)
  moved = jnp.moveaxis(ring, axis, 0).at[entries].set(jnp.moveaxis(tail, axis, 0),
                                                      unique_indices=True)
  return jnp.moveaxis(moved, 0, axis)


def ring_slots(index: jax.Array, size: int) -> jax.Array:
  """int32 [size]: the absolute slot each ring entry holds after slots [0, index) were written
  (the largest p < index with p mod size = entry), or -1 where none was."""
  last = index - 1 - jnp.mod(index - 1 - jnp.arange(size), size)
  return jnp.where(last >= 0, last, -1).astype(jnp.int32)


def decode_mask(q_segments: jax.Array, k_segments: jax.Array, index: jax.Array,
                sliding_window: int | jax.Array | None,
                k_slots: jax.Array | None = None) -> jax.Array:
  """bool [B, T, L]: which of L keys (at absolute slots `k_slots` [L], -1 for none; default
  the cache's slots 0..L-1) each of the T queries written at `index` sees (the window may be
  traced: a scanned step's layer picks its own)."""
  t, length = q_segments.shape[1], k_segments.shape[1]
  q_slot = index + jnp.arange(t)[:, None]
  k_slot = (jnp.arange(length) if k_slots is None else k_slots)[None, :]
  allowed = (k_slot >= 0) & (k_slot <= q_slot)
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
