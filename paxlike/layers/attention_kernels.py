"""Which attention kernel runs, and the TPU (Pallas splash) kernel itself.

`attention_impl` names: 'auto' (the default) picks per platform and shape: cuDNN's fused flash
attention on NVIDIA GPUs when a tiny probe of it (forward and backward, this dtype, head dim and
head counts) compiles, Pallas splash attention on TPU when the sequence length splits into
128-multiple blocks, XLA's attention otherwise (a fallback is said once in the log). 'xla',
'cudnn' and 'splash' force one; a forced kernel the platform cannot run is a config error
(`UserError`, exit 2), never a silent fallback.

Every kernel computes the same causal (optionally sliding-window) grouped-query attention on
q [B, T, N, H], k and v [B, T, K, H] with N a multiple of K, softmax scale 1/sqrt(H) unless a
`scale` is given; with `softcap` the scores are soft-capped (cap · tanh(s / cap), Gemma 2):
splash does it in its kernel, XLA by a plain einsum attention, cuDNN cannot (refused). With
`segment_ids` int32[B, T] (packed documents), a query sees only keys of its own segment: splash
takes them as its `SegmentIds`; XLA and cuDNN take a boolean [B, 1, T, T] mask (cuDNN turns it
into a bias), and-ed with the causal and window masks. Padding (segment 0) attends padding, so
no softmax row is empty.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from paxlike.errors import UserError

IMPLS = ('auto', 'xla', 'cudnn', 'splash')
# Tried largest first; one must divide the sequence length. On a TPU v5e (350M, seq 2048, batch
# 4) 1024-blocks with the fused backward kernel (dq, dk and dv in one pass) took the step from
# 0.3042 s (512-blocks, separate dq and dkv kernels) to 0.2818 s (docs/benchmarks.md).
SPLASH_BLOCKS = (1024, 512, 256, 128)


def splash_block(seq_len: int) -> int | None:
  """The splash tile size for `seq_len`, or None when no 128-multiple block divides it."""
  return next((b for b in SPLASH_BLOCKS if seq_len % b == 0), None)


def _splash_kernel(seq_len: int, groups: int, window: int | None, interpret: bool,
                   softcap: float | None = None) -> Any:
  """A single-example MQA splash kernel: q [groups, T, H], k and v [T, H] -> [groups, T, H].

  Made afresh in every trace that calls it: the kernel holds its masks as arrays, and a kernel
  kept from one trace to the next carried the first trace's tracers (flax's scan inits its body
  abstractly; lm.Llama125M failed so on JAX 0.10). The costly part, turning the dense mask into
  block lists, is numpy that splash caches itself (`_process_mask`)."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # TPU-only module.
  shape = (seq_len, seq_len)
  head_mask = (splash.CausalMask(shape) if window is None
               else splash.LocalMask(shape, window_size=(window - 1, 0), offset=0))
  block = splash_block(seq_len)
  sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                            block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                            use_fused_bwd_kernel=True)
  return splash.make_splash_mqa_single_device(
      splash.MultiHeadMask([head_mask] * groups), block_sizes=sizes, interpret=interpret,
      attn_logits_soft_cap=softcap)


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, sliding_window: int | None = None,
                     interpret: bool = False, segment_ids: jax.Array | None = None,
                     scale: float | None = None, softcap: float | None = None) -> jax.Array:
  """Causal GQA attention with the Pallas splash kernel, unsharded (see `attend` for meshes).

  Each kv head serves its `N // K` query heads as one MQA kernel call, vmapped over batch and kv
  heads. `interpret=True` runs the kernel in Pallas' interpreter (any platform; for tests).
  `segment_ids` [B, T] keeps each query in its own segment (splash's `SegmentIds`).
  """
  b, t, n, h = q.shape
  kv = k.shape[2]
  if splash_block(t) is None:
    raise UserError(f"attention_impl='splash' needs a sequence length divisible by 128, got {t}")
  kernel = _splash_kernel(t, n // kv, sliding_window, interpret, softcap)
  scale = jnp.asarray(1 / np.sqrt(h) if scale is None else scale, q.dtype)
  grouped_q = (q * scale).transpose(0, 2, 1, 3).reshape(b, kv, n // kv, t, h)
  k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
  if segment_ids is None:
    out = jax.vmap(jax.vmap(kernel))(grouped_q, k, v)
  else:
    from jax.experimental.pallas.ops.tpu import splash_attention as splash  # TPU-only module.
    one = lambda q, k, v, ids: kernel(q, k, v, segment_ids=splash.SegmentIds(q=ids, kv=ids))
    out = jax.vmap(jax.vmap(one, in_axes=(0, 0, 0, None)))(grouped_q, k, v, segment_ids)
  return out.reshape(b, n, t, h).transpose(0, 2, 1, 3)


def _sharded_splash(q: jax.Array, k: jax.Array, v: jax.Array, sliding_window: int | None,
                    q_spec: Any, kv_spec: Any, interpret: bool,
                    segment_ids: jax.Array | None, scale: float | None = None,
                    softcap: float | None = None) -> jax.Array:
  """`splash_attention` per shard under the current mesh (a Pallas call is not partitioned by
  XLA). Shards split batch and heads only; kv heads are repeated when they are sharded
  differently from the query heads, so each shard keeps whole GQA groups."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return splash_attention(q, k, v, sliding_window, interpret, segment_ids, scale, softcap)
  if q_spec[1] is not None:
    raise UserError("attention_impl='splash' cannot run with the sequence ('length') sharded")
  if tuple(kv_spec)[2:3] != tuple(q_spec)[2:3]:
    groups = q.shape[2] // k.shape[2]
    k, v = (jnp.repeat(x, groups, axis=2) for x in (k, v))
    kv_spec = q_spec
  fn = functools.partial(splash_attention, sliding_window=sliding_window, interpret=interpret,
                         scale=scale, softcap=softcap)
  if segment_ids is None:
    return jax.shard_map(fn, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec), out_specs=q_spec,
                         check_vma=False)(q, k, v)
  ids_spec = jax.sharding.PartitionSpec(q_spec[0], None)
  return jax.shard_map(lambda q, k, v, ids: fn(q, k, v, segment_ids=ids), mesh=mesh,
                       in_specs=(q_spec, kv_spec, kv_spec, ids_spec), out_specs=q_spec,
                       check_vma=False)(q, k, v, segment_ids)


@functools.lru_cache(maxsize=None)
def cudnn_refusal(dtype: str, num_heads: int, num_kv_heads: int, head_dim: int,
                  sliding_window: int | None, segmented: bool = False) -> str | None:
  """Why cuDNN flash attention cannot run these shapes here (None when its forward and backward
  compile). Compiles a [1, 128] probe once per shape (`segmented`: with a segment mask)."""
  if jax.devices()[0].platform != 'gpu':
    return f'no NVIDIA GPU (platform {jax.devices()[0].platform})'
  window = None if sliding_window is None else (sliding_window - 1, 0)
  attn = functools.partial(jax.nn.dot_product_attention, is_causal=True,
                           local_window_size=window, implementation='cudnn')
  ids = jnp.repeat(jnp.arange(2, dtype=jnp.int32), 64)[None] if segmented else None
  loss = lambda q, k, v: attn(q, k, v, mask=segment_mask(ids)).astype(jnp.float32).sum()
  q = jax.ShapeDtypeStruct((1, 128, num_heads, head_dim), jnp.dtype(dtype))
  kv = jax.ShapeDtypeStruct((1, 128, num_kv_heads, head_dim), jnp.dtype(dtype))
  try:
    jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv).compile()
  except Exception as error:  # cuDNN and XLA refuse with several exception types.
    return f'{type(error).__name__}: {str(error).strip().splitlines()[0][:200]}'
  return None


@functools.lru_cache(maxsize=None)
def _say_once(message: str) -> None:
  logging.warning(message)


def resolve(impl: str, *, dtype: Any, num_heads: int, num_kv_heads: int, head_dim: int,
            seq_len: int, sliding_window: int | None = None, segmented: bool = False,
            softcap: float | None = None) -> str:
  """The kernel that runs for `impl` on this platform: 'xla', 'cudnn' or 'splash'
  (`segmented`: with packed documents' segment ids; `softcap`: soft-capped scores).

  Raises UserError for an unknown name, or a forced kernel this platform cannot run.
  """
  if impl not in IMPLS:
    raise UserError(f'attention_impl must be one of {", ".join(IMPLS)}, got {impl!r}')
  platform = jax.devices()[0].platform
  if impl == 'xla':
    return impl
  if impl == 'splash' or (impl == 'auto' and platform == 'tpu'):
    why = ('needs a TPU' if platform != 'tpu' else
           None if splash_block(seq_len) else f'needs seq_len % 128 == 0, got {seq_len}')
    return _kernel_or_xla(impl, 'splash', why,
                          f"attention_impl='splash' {why} (platform {platform})",
                          f'splash {why}')
  if impl == 'cudnn' or platform == 'gpu':
    why = 'no logit soft-capping in cuDNN attention' if softcap is not None else cudnn_refusal(
        jnp.dtype(dtype).name, num_heads, num_kv_heads, head_dim, sliding_window, segmented)
    return _kernel_or_xla(
        impl, 'cudnn', why,
        f"attention_impl='cudnn': cuDNN flash attention cannot run here: {why}",
        f'cuDNN refused: {why}')
  return 'xla'


def _kernel_or_xla(impl: str, kernel: str, why: str | None, forced_error: str,
                   fallback_note: str) -> str:
  """`kernel` where nothing refuses it (`why` is None); else a UserError if the config forced
  it, or XLA, said once, under 'auto'."""
  if why is None:
    return kernel
  if impl == kernel:
    raise UserError(forced_error)
  _say_once(f'attention_impl=auto: XLA attention ({fallback_note})')
  return 'xla'


def segment_mask(segment_ids: jax.Array | None) -> jax.Array | None:
  """bool [B, 1, T, T]: query i may see key j of the same segment (None for None)."""
  if segment_ids is None:
    return None
  return (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]


def attend(q: jax.Array, k: jax.Array, v: jax.Array, kernel: str, sliding_window: int | None,
           q_spec: Any = None, kv_spec: Any = None, interpret: bool = False,
           segment_ids: jax.Array | None = None, scale: float | None = None,
           softcap: float | None = None) -> jax.Array:
  """Causal GQA attention with a resolved `kernel`; specs place splash's shards on the mesh
  (`interpret`: splash in Pallas' interpreter, for tests off TPU); `segment_ids` [B, T] keep
  packed documents apart; `scale` and `softcap` as in the module docstring."""
  if kernel == 'splash':
    return _sharded_splash(q, k, v, sliding_window, q_spec, kv_spec, interpret, segment_ids,
                           scale, softcap)
  if softcap is not None:
    return softcapped_attention(q, k, v, sliding_window, segment_ids, scale, softcap)
  window = None if sliding_window is None else (sliding_window - 1, 0)
  return jax.nn.dot_product_attention(q, k, v, mask=segment_mask(segment_ids), is_causal=True,
                                      local_window_size=window, implementation=kernel,
                                      scale=scale)


def softcapped_attention(q: jax.Array, k: jax.Array, v: jax.Array, sliding_window: int | None,
                         segment_ids: jax.Array | None, scale: float | None,
                         softcap: float) -> jax.Array:
  """XLA's causal GQA attention with soft-capped scores (softmax in float32)."""
  b, t, n, h = q.shape
  kv = k.shape[2]
  grouped = q.reshape(b, t, kv, n // kv, h)
  scores = jnp.einsum('btkgh,bskh->bkgts', grouped, k, preferred_element_type=jnp.float32)
  scores = scores * np.float32(h ** -0.5 if scale is None else scale)
  scores = jnp.tanh(scores / softcap) * softcap
  query, key = jnp.arange(t)[:, None], jnp.arange(t)[None, :]
  allowed = (key <= query) & (True if sliding_window is None else query - key < sliding_window)
  mask = allowed[None, None, None]
  if segment_ids is not None:
    mask = mask & segment_mask(segment_ids)[:, :, None]
  probs = jax.nn.softmax(jnp.where(mask, scores, jnp.finfo(jnp.float32).min), axis=-1)
  out = jnp.einsum('bkgts,bskh->btkgh', probs.astype(v.dtype), v)
  return out.reshape(b, t, n, h)
