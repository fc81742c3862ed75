"""Causal multi-head / grouped-query self-attention with rotary embeddings, optional QK-norm,
biases, sliding window (per layer, or per scanned step), custom softmax scale and soft-capping."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from paxlike.layers import attention_kernels, kv_cache, lora, quantization, rope
from paxlike.layers.norms import rms_norm
from paxlike.layers.rope import RopeScaling, apply_rope  # noqa: F401 (apply_rope: re-exported)

DType = Any

# Logical names of the attention activations.
HEADS_ACT = ('batch', 'length', 'heads', 'kv')
KV_HEADS_ACT = ('batch', 'length', 'kv_heads', 'kv')


class CausalSelfAttention(nn.Module):
  """Causal self-attention; grouped-query when num_kv_heads < num_heads.

  Parameters: query [embed, heads, kv], key/value [embed, kv_heads, kv],
  out [heads, kv, embed]; with `qkv_bias` also query_bias [heads, kv] and key_bias/value_bias
  [kv_heads, kv], with `out_bias` out_bias [embed]. `sliding_window=W` lets each query of a
  local layer (`is_local`, or the traced `local` flag of a scanned step) see itself and the
  W - 1 previous tokens; a local layer uses `local_rope_base` (unscaled) when set, every other
  layer `rope_base` with `rope_scaling`. `qk_norm` RMS-normalises each query and
  key head over its features (learned scale 'query_norm'/'key_norm', named
  ('kv',); weight offset `norm_weight_offset`) before rope, as in Gemma 3 / Qwen 3. Scores are
  scaled by `query_scale` (None: 1/sqrt(head_dim)) and soft-capped to
  ±`attn_logit_softcap` (cap · tanh(s / cap)) when set. `implementation` names the attention
  kernel: 'auto' (cuDNN flash on NVIDIA GPUs, Pallas splash on TPU, XLA otherwise), 'xla',
  'cudnn' or 'splash'; see `attention_kernels.resolve`. Decoding with a KV cache always uses
  XLA's attention (one query per step). With `lora_rank` > 0, the projections named in
  `lora_targets` get LoRA adapters (see `lora`). `base_quantization` ('int8', 'nf4') stores
  the four kernels quantized and frozen (see `quantization`; `double_quant`: NF4's scales too).
  """

  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope: bool = True
  rope_base: float = 10_000.0
  sliding_window: int | None = None
  qk_norm: bool = False
  norm_eps: float = 1e-6
  rope_scaling: RopeScaling | None = None
  local_rope_base: float | None = None
  is_local: bool = True
  qkv_bias: bool = False
  out_bias: bool = False
  query_scale: float | None = None
  attn_logit_softcap: float | None = None
  norm_weight_offset: float = 0.0
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32
  implementation: str = 'auto'
  fused_qkv: bool = False
  base_quantization: str = 'none'
  double_quant: bool = True
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
    kernel = quantization.declare(self, name, shape, names, init, len(fan_in_axes),
                                  self.base_quantization, self.double_quant, self.param_dtype)
    if self.base_quantization != 'none':
      return quantization.dequantize(kernel, self.dtype)
    return jnp.asarray(kernel, self.dtype)

  def _head_norm(self, name: str) -> nn.Module:
    """RMSNorm over the last (head feature) axis, scale named ('kv',)."""
    return rms_norm(self.dtype, self.param_dtype, name, self.norm_eps, self.norm_weight_offset,
                    'kv')

  def _bias(self, name: str, y: jax.Array, names: tuple[str, ...]) -> jax.Array:
    """y plus a zero-initialised bias `name` over its trailing axes."""
    init = nn.with_logical_partitioning(nn.initializers.zeros, names)
    return y + jnp.asarray(self.param(name, init, y.shape[2:], self.param_dtype), self.dtype)

  def _rope(self, local: bool) -> tuple[float, RopeScaling | None]:
    """(base, scaling) of a local (True) or global layer."""
    if local and self.local_rope_base is not None:
      return self.local_rope_base, None
    return self.rope_base, self.rope_scaling

  def _rope_tables(self, positions: jax.Array, local: jax.Array | None
                   ) -> tuple[jax.Array, jax.Array]:
    """cos, sin of this layer (`local`: a scanned step's traced flag picks them)."""
    h = self.head_dim
    if local is None or self.local_rope_base is None:
      return rope.tables(positions, h, *self._rope(self.is_local if local is None else False))
    local_tables = rope.tables(positions, h, *self._rope(True))
    global_tables = rope.tables(positions, h, *self._rope(False))
    return tuple(jnp.where(local, a, b) for a, b in zip(local_tables, global_tables))

  def _window(self, local: jax.Array | None) -> int | jax.Array | None:
    """This layer's window: static, or (a scanned step's `local`) a traced one, where a global
    layer's is larger than any cache."""
    if self.sliding_window is None:
      return None
    if local is None:
      return self.sliding_window if self.is_local else None
    return jnp.where(local, self.sliding_window, jnp.iinfo(jnp.int32).max)

  @nn.compact
  def __call__(self, x: jax.Array, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None, decode: bool = False,
               cache_len: int | None = None, local: jax.Array | None = None) -> jax.Array:
    """x: [B, T, embed] -> [B, T, embed].

    `segment_ids` int32[B, T] keep packed documents apart (0 is padding); `positions` [B, T]
    are the rope positions (default 0..T-1). `decode` attends over a 'cache' collection of
    `cache_len` slots (created on the first call): the T new keys and values are written at
    the cache's index, which then advances by T (see `kv_cache`). `local` (a scanned step's
    traced bool) overrides `is_local`.
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
    q, k, v = self._projections(x, wq, wk, wv)
    q = self._adapted('query', x, q, ('embed',), ('heads', 'kv'))
    k = self._adapted('key', x, k, ('embed',), ('kv_heads', 'kv'))
    v = self._adapted('value', x, v, ('embed',), ('kv_heads', 'kv'))
    if self.qkv_bias:
      q = self._bias('query_bias', q, ('heads', 'kv'))
      k = self._bias('key_bias', k, ('kv_heads', 'kv'))
      v = self._bias('value_bias', v, ('kv_heads', 'kv'))
    if self.qk_norm:
      q = self._head_norm('query_norm')(q)
      k = self._head_norm('key_norm')(k)
    if self.rope:
      positions = jnp.arange(x.shape[1]) if positions is None else positions
      cos, sin = self._rope_tables(positions, local)
      q, k = rope.rotate(q, cos, sin), rope.rotate(k, cos, sin)
    q = nn.with_logical_constraint(q, HEADS_ACT)
    k = nn.with_logical_constraint(k, KV_HEADS_ACT)
    v = nn.with_logical_constraint(v, KV_HEADS_ACT)
    if decode:
      out = self._cached_attention(q, k, v, segment_ids, cache_len, self._window(local))
    else:
      out = self._attention(q, k, v, segment_ids, local)
    out = nn.with_logical_constraint(out, HEADS_ACT)
    if decode:  # As a plain matmul: the einsum made XLA transpose `wo` at every decode step.
      y = out.reshape(*out.shape[:2], n * h) @ wo.reshape(n * h, d)
    else:
      y = jnp.einsum('btnh,nhd->btd', out, wo)
    y = self._adapted('out', out, y, ('heads', 'kv'), ('embed',))
    return self._bias('out_bias', y, ('embed',)) if self.out_bias else y

  def _attention(self, q: jax.Array, k: jax.Array, v: jax.Array,
                 segment_ids: jax.Array | None, local: jax.Array | None) -> jax.Array:
    """The kernel's attention over the whole sequence; a scanned step's traced `local` picks
    the windowed or the full call (each a static kernel) with `lax.cond`."""
    n, n_kv, h = self.num_heads, self.num_kv_heads, self.head_dim

    def run(window: int | None) -> jax.Array:
      kernel = attention_kernels.resolve(
          self.implementation, dtype=q.dtype, num_heads=n, num_kv_heads=n_kv, head_dim=h,
          seq_len=q.shape[1], sliding_window=window, segmented=segment_ids is not None,
          softcap=self.attn_logit_softcap)
      return attention_kernels.attend(q, k, v, kernel, window,
                                      nn.logical_to_mesh_axes(HEADS_ACT),
                                      nn.logical_to_mesh_axes(KV_HEADS_ACT),
                                      segment_ids=segment_ids, scale=self.query_scale,
                                      softcap=self.attn_logit_softcap)

    if local is None or self.sliding_window is None:
      return run(self._window(None) if local is None else None)
    return jax.lax.cond(local, lambda: run(self.sliding_window), lambda: run(None))

  def _projections(self, x: jax.Array, wq: jax.Array, wk: jax.Array, wv: jax.Array
                   ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q [B, T, N, H], k and v [B, T, K, H]: three einsums, or with `fused_qkv` one 2-D matmul
    by the three kernels side by side (on a TPU the [embed, heads, 64] einsums ran at half the
    MXU's rate: a 64-wide minor axis fills half a 128-lane tile)."""
    if not self.fused_qkv:
      return tuple(jnp.einsum('btd,dnh->btnh', x, w) for w in (wq, wk, wv))
    d = x.shape[-1]
    widths = [w.shape[1] * w.shape[2] for w in (wq, wk, wv)]
    fused = jnp.concatenate([w.reshape(d, -1) for w in (wq, wk, wv)], axis=1)
    qkv = x @ fused
    q, k, v = jnp.split(qkv, [widths[0], widths[0] + widths[1]], axis=-1)
    return tuple(y.reshape(*x.shape[:2], w.shape[1], w.shape[2])
                 for y, w in zip((q, k, v), (wq, wk, wv)))

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
                        segment_ids: jax.Array | None, cache_len: int | None,
                        window: int | jax.Array | None) -> jax.Array:
    """Writes k, v (and their segment ids) into the cache at its index, then attends q over
    every cache slot its mask allows (T is the prompt once, then 1). A static window (a local
    layer, not a scanned step's traced one) keeps a ring of min(window, cache_len) slots
    (`kv_cache`): a Gemma or Mistral local layer holds its window, not the whole context."""
    b, t, n_kv, h = k.shape
    if segment_ids is None:
      segment_ids = jnp.ones((b, t), jnp.int32)
    if not self.has_variable('cache', 'key') and cache_len is None:
      raise ValueError('decode=True needs cache_len on the first (prefill) call')
    ring = isinstance(window, int)
    slots = min(window, cache_len) if ring and cache_len is not None else cache_len
    zeros = lambda shape, dtype: lambda: jnp.zeros(shape, dtype)
    keys = self.variable('cache', 'key', zeros((b, n_kv, slots, h), k.dtype))
    values = self.variable('cache', 'value', zeros((b, n_kv, slots, h), v.dtype))
    segments = self.variable('cache', 'segment_ids', zeros((b, slots), jnp.int32))
    index = self.variable('cache', 'index', zeros((), jnp.int32))
    start, segment_ids = index.value, segment_ids.astype(jnp.int32)
    new = (k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), segment_ids)
    index.value = start + t
    if ring:
      return self._ring_attention(q, new, (keys, values, segments), start, window)
    for cache, fresh in zip((keys, values), new):
      cache.value = nn.with_logical_constraint(kv_cache.write(cache.value, fresh, start, axis=2),
                                               kv_cache.CACHE_AXES)
    segments.value = kv_cache.write(segments.value, segment_ids, start, axis=1)
    mask = kv_cache.decode_mask(segment_ids, segments.value, start, window)
    return kv_cache.attend(q, keys.value, values.value, mask, self.query_scale,
                           self.attn_logit_softcap)

  def _ring_attention(self, q: jax.Array, new: tuple[jax.Array, ...], cache: tuple[Any, ...],
                      start: jax.Array, window: int) -> jax.Array:
    """q over the ring as it was and the T `new` keys, values [B, K, T, H] and segment ids
    [B, T] (absolute slots [start, start + T)), which then go into the ring."""
    t, size = new[2].shape[1], cache[0].value.shape[2]
    both = [jnp.concatenate([c.value, n.astype(c.value.dtype)], axis=axis)
            for c, n, axis in zip(cache, new, (2, 2, 1))]
    k_slots = jnp.concatenate([kv_cache.ring_slots(start, size), start + jnp.arange(t)])
    mask = kv_cache.decode_mask(new[2], both[2], start, window, k_slots)
    for c, fresh, axis in zip(cache, new, (2, 2, 1)):
      written = kv_cache.ring_write(c.value, fresh, start, axis)
      c.value = written if axis == 1 else nn.with_logical_constraint(written, kv_cache.CACHE_AXES)
    return kv_cache.attend(q, both[0], both[1], mask, self.query_scale, self.attn_logit_softcap)
