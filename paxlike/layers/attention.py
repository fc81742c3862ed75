"""Causal multi-head / grouped-query self-attention with rotary embeddings and optional QK-norm."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from paxlike.layers import attention_kernels, kv_cache, lora

DType = Any

# Logical names of the attention activations.
HEADS_ACT = ('batch', 'length', 'heads', 'kv')
KV_HEADS_ACT = ('batch', 'length', 'kv_heads', 'kv')


def apply_rope(x: jax.Array, positions: jax.Array, base: float = 10_000.0) -> jax.Array:
  """Rotates features of x[B, T, N, H] by angles positions * base^(-2i/H).

  `positions` is [T] (shared by the batch) or [B, T] (per row: packed documents, decoding).
  Uses the "rotate half" layout: feature i is paired with feature i + H/2.
  Computed in float32 and cast back to x.dtype.
  """
  half = x.shape[-1] // 2
  freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angles = positions.astype(jnp.float32)[..., None] * freq  # [(B,) T, H/2]
  sin = jnp.sin(angles)[..., None, :]  # [(B,) T, 1, H/2], broadcasts over heads
  cos = jnp.cos(angles)[..., None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


class CausalSelfAttention(nn.Module):
  """Causal self-attention; grouped-query when num_kv_heads < num_heads.

  Parameters: query [embed, heads, kv], key/value [embed, kv_heads, kv],
  out [heads, kv, embed]; no biases. `sliding_window=W` lets each query see
  itself and the W - 1 previous tokens. `qk_norm` RMS-normalises each query and
  key head over its features (learned scale 'query_norm'/'key_norm', named
  ('kv',)) before rope, as in Gemma 3 / Qwen 3. `implementation` names the attention
  kernel: 'auto' (cuDNN flash on NVIDIA GPUs, Pallas splash on TPU, XLA otherwise), 'xla',
  'cudnn' or 'splash'; see `attention_kernels.resolve`. Decoding with a KV cache always uses
  XLA's attention (one query per step). With `lora_rank` > 0, the projections named in
  `lora_targets` get LoRA adapters (see `lora`).
  """

  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope: bool = True
  rope_base: float = 10_000.0
  sliding_window: int | None = None
  qk_norm: bool = False
  norm_eps: float = 1e-6
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32
  implementation: str = 'auto'
  lora_rank: int = 0
  lora_alpha: float = 16.0
  lora_targets: tuple[str, ...] = ()

  def _kernel(self, name: str, shape: tuple[int, ...], names: tuple[str, ...],
              fan_in_axes: tuple[int, ...]) -> jax.Array:
    """A [shape] parameter named `names`, LeCun-normal over `fan_in_axes`, in self.dtype."""
    # Not nn.DenseGeneral: it initialises multi-axis kernels flat, then unboxes them, which
    # applies the N-d logical constraint to a 2-d array and fails under a mesh (flax 0.12.12).
    fan_out_axes = tuple(a for a in range(len(shape)) if a not in fan_in_axes)
    init = nn.initializers.lecun_normal(in_axis=fan_in_axes, out_axis=fan_out_axes)
    kernel = self.param(name, nn.with_logical_partitioning(init, names), shape, self.param_dtype)
    return jnp.asarray(kernel, self.dtype)

  def _head_norm(self, name: str) -> nn.RMSNorm:
    """RMSNorm over the last (head feature) axis, scale named ('kv',)."""
    scale_init = nn.with_logical_partitioning(nn.initializers.ones, ('kv',))
    return nn.RMSNorm(epsilon=self.norm_eps, scale_init=scale_init, dtype=self.dtype,
                      param_dtype=self.param_dtype, name=name)

  @nn.compact
  def __call__(self, x: jax.Array, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None, decode: bool = False,
               cache_len: int | None = None) -> jax.Array:
    """x: [B, T, embed] -> [B, T, embed].

    `segment_ids` int32[B, T] keep packed documents apart (0 is padding); `positions` [B, T]
    are the rope positions (default 0..T-1). `decode` attends over a 'cache' collection of
    `cache_len` slots (created on the first call): the T new keys and values are written at
    the cache's index, which then advances by T (see `kv_cache`).
    """
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f'num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}'
      )
    if self.sliding_window is not None and self.sliding_window < 1:
      raise ValueError(f'sliding_window must be >= 1, got {self.sliding_window}')
    d, n, n_kv, h = x.shape[-1], self.num_heads, self.num_kv_heads, self.head_dim
    x = jnp.asarray(x, self.dtype)
    wq = self._kernel('query', (d, n, h), ('embed', 'heads', 'kv'), (0,))
    wk = self._kernel('key', (d, n_kv, h), ('embed', 'kv_heads', 'kv'), (0,))
    wv = self._kernel('value', (d, n_kv, h), ('embed', 'kv_heads', 'kv'), (0,))
    wo = self._kernel('out', (n, h, d), ('heads', 'kv', 'embed'), (0, 1))
    q, k, v = (jnp.einsum('btd,dnh->btnh', x, w) for w in (wq, wk, wv))
    q = self._adapted('query', x, q, ('embed',), ('heads', 'kv'))
    k = self._adapted('key', x, k, ('embed',), ('kv_heads', 'kv'))
    v = self._adapted('value', x, v, ('embed',), ('kv_heads', 'kv'))
    if self.qk_norm:
      q = self._head_norm('query_norm')(q)
      k = self._head_norm('key_norm')(k)
    if self.rope:
      positions = jnp.arange(x.shape[1]) if positions is None else positions
      q = apply_rope(q, positions, self.rope_base)
      k = apply_rope(k, positions, self.rope_base)
    q = nn.with_logical_constraint(q, HEADS_ACT)
    k = nn.with_logical_constraint(k, KV_HEADS_ACT)
    v = nn.with_logical_constraint(v, KV_HEADS_ACT)
    if decode:
      out = self._cached_attention(q, k, v, segment_ids, cache_len)
    else:
      kernel = attention_kernels.resolve(
          self.implementation, dtype=q.dtype, num_heads=n, num_kv_heads=n_kv, head_dim=h,
          seq_len=x.shape[1], sliding_window=self.sliding_window,
          segmented=segment_ids is not None)
      out = attention_kernels.attend(q, k, v, kernel, self.sliding_window,
                                     nn.logical_to_mesh_axes(HEADS_ACT),
                                     nn.logical_to_mesh_axes(KV_HEADS_ACT),
                                     segment_ids=segment_ids)
    out = nn.with_logical_constraint(out, HEADS_ACT)
    if decode:  # As a plain matmul: the einsum made XLA transpose `wo` at every decode step.
      y = out.reshape(*out.shape[:2], n * h) @ wo.reshape(n * h, d)
    else:
      y = jnp.einsum('btnh,nhd->btd', out, wo)
    return self._adapted('out', out, y, ('heads', 'kv'), ('embed',))

  def _adapted(self, name: str, x: jax.Array, y: jax.Array, in_names: tuple[str, ...],
               out_names: tuple[str, ...]) -> jax.Array:
    """The projection `y` of `x` by kernel `name`, plus its LoRA term when it is a target
    (the adapters are declared after every kernel, so the kernels' init does not move)."""
    if not self.lora_rank or name not in self.lora_targets:
      return y
    in_shape = x.shape[2:]
    return y + lora.adapter(self, name, x, in_shape, y.shape[2:], in_names, out_names,
                            self.lora_rank, self.lora_alpha, self.dtype, self.param_dtype)

  def _cached_attention(self, q: jax.Array, k: jax.Array, v: jax.Array,
                        segment_ids: jax.Array | None, cache_len: int | None) -> jax.Array:
    """Writes k, v (and their segment ids) into the cache at its index, then attends q over
    every cache slot its mask allows (T is the prompt once, then 1)."""
    b, t, n_kv, h = k.shape
    if segment_ids is None:
      segment_ids = jnp.ones((b, t), jnp.int32)
    if not self.has_variable('cache', 'key') and cache_len is None:
      raise ValueError('decode=True needs cache_len on the first (prefill) call')
    zeros = lambda shape, dtype: lambda: jnp.zeros(shape, dtype)
    keys = self.variable('cache', 'key', zeros((b, n_kv, cache_len, h), k.dtype))
    values = self.variable('cache', 'value', zeros((b, n_kv, cache_len, h), v.dtype))
    segments = self.variable('cache', 'segment_ids', zeros((b, cache_len), jnp.int32))
    index = self.variable('cache', 'index', zeros((), jnp.int32))
    start = index.value
    for cache, new in ((keys, k), (values, v)):
      cache.value = nn.with_logical_constraint(
          kv_cache.write(cache.value, new.transpose(0, 2, 1, 3), start, axis=2),
          kv_cache.CACHE_AXES)
    segments.value = kv_cache.write(segments.value, segment_ids.astype(jnp.int32), start, axis=1)
    index.value = start + t
    mask = kv_cache.decode_mask(segment_ids, segments.value, start, self.sliding_window)
    return kv_cache.attend(q, keys.value, values.value, mask)
