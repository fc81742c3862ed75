"""Causal attention kernels head to head: forward and forward + backward ms of each variant on
q, k, v [B, T, N, H] (the layout paxlike's attention hands its kernel), in one process.

    python -m benchmarks.attention_kernels                          # 350M shapes, 6 × 2048
    python -m benchmarks.attention_kernels --heads 16x64,8x128 --variants paxlike,tokamax_1024
    python -m benchmarks.attention_kernels --quick                  # tiny, interpreted (tests)

Variants (each takes and returns [B, T, N, H], so the transposes a kernel needs are timed too):
  paxlike          paxlike.layers.attention_kernels.splash_attention (what 'auto' runs on a TPU)
  splash_B         JAX's splash kernel, B-blocks, fused backward ('splash_B_kseq': k seq-minor)
  tokamax_B        tokamax's splash kernel (base-2 exponentials, fused reciprocal), B-blocks;
                   '_sched': its experimental scheduler; '_dq3': dq reduced in 3 steps
  xla              jax.nn.dot_product_attention(implementation='xla')
A variant whose module is missing (tokamax off a TPU machine's bundle) or that fails to compile
is reported with its one-line error. FLOPs are counted as the model's MFU counts attention
(paxlike/families/lm_flops.py: 4·B·N·H·C·T forward with C = (T + 1) / 2 keys on average, ×3
for forward + backward); `tflops` is that count over the measured time.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

from benchmarks import common

Kernel = Callable[[Any, Any, Any], Any]


def _splash(block_size: int, k_seq_minor: bool, interpret: bool) -> Callable[[int, int], Kernel]:
  def make(seq: int, heads: int) -> Kernel:
    import jax
    from jax.experimental.pallas.ops.tpu import splash_attention as splash
    block = min(block_size, seq)  # --quick's short sequences: one block.
    layout = splash.QKVLayout.SEQ_MINOR if k_seq_minor else splash.QKVLayout.HEAD_DIM_MINOR
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                              block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                              use_fused_bwd_kernel=True, k_layout=layout)
    mask = splash.MultiHeadMask([splash.CausalMask((seq, seq))] * heads)
    kernel = splash.make_splash_mha_single_device(mask, block_sizes=sizes, interpret=interpret)
    return _heads_major(jax.vmap(kernel))
  return make


def _tokamax(block_size: int, scheduler: bool, dq_steps: int | None,
             interpret: bool) -> Callable[[int, int], Kernel]:
  def make(seq: int, heads: int) -> Kernel:
    import jax
    from tokamax._src.ops.experimental.tpu.splash_attention import (
        splash_attention_kernel as splash, splash_attention_mask as masks)
    block = min(block_size, seq)
    config = splash.SplashConfig(
        block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
        block_kv_dkv=block, block_kv_dkv_compute=block, use_experimental_scheduler=scheduler,
        dq_reduction_steps=dq_steps, interpret=interpret)
    kernel = splash.make_splash_mha(masks.CausalMask((seq, seq)), config=config, q_seq_shards=1)
    return _heads_major(jax.vmap(kernel))
  return make


def _heads_major(kernel: Kernel) -> Kernel:
  """A [B, N, T, H] kernel as one on [B, T, N, H], scaling q by 1/sqrt(H) first."""
  def run(q, k, v):
    to = lambda x: x.transpose(0, 2, 1, 3)
    return to(kernel(to(q * (q.shape[-1] ** -0.5)), to(k), to(v)))
  return run


def _paxlike(interpret: bool) -> Callable[[int, int], Kernel]:
  def make(seq: int, heads: int) -> Kernel:
    from paxlike.layers import attention_kernels
    return functools.partial(attention_kernels.splash_attention, interpret=interpret)
  return make


def _xla(seq: int, heads: int) -> Kernel:
  import jax
  return functools.partial(jax.nn.dot_product_attention, is_causal=True, implementation='xla')


def variants(interpret: bool) -> dict[str, Callable[[int, int], Kernel]]:
  """Every variant's maker: (seq, heads) -> kernel on [B, T, N, H]."""
  out: dict[str, Callable[[int, int], Kernel]] = {'paxlike': _paxlike(interpret)}
  for block in (1024, 512, 256, 128):
    out[f'splash_{block}'] = _splash(block, False, interpret)
    out[f'tokamax_{block}'] = _tokamax(block, False, None, interpret)
  out['splash_1024_kseq'] = _splash(1024, True, interpret)
  out['tokamax_1024_sched'] = _tokamax(1024, True, None, interpret)
  out['tokamax_512_sched'] = _tokamax(512, True, None, interpret)
  out['tokamax_1024_dq3'] = _tokamax(1024, False, 3, interpret)
  out['xla'] = _xla
  return out


DEFAULT = ('paxlike,splash_1024,splash_512,splash_256,splash_1024_kseq,tokamax_1024,tokamax_512,'
           'tokamax_256,tokamax_1024_sched,tokamax_512_sched,tokamax_1024_dq3,xla')


def attention_flops(batch: int, seq: int, heads: int, head_dim: int) -> float:
  """Forward FLOPs of causal attention as the MFU counts them (two matmuls over (T + 1) / 2
  keys on average per query)."""
  return 4.0 * batch * heads * head_dim * seq * (seq + 1) / 2


def time_variant(make: Callable[[int, int], Kernel], shape: tuple[int, int, int, int],
                 steps: int) -> dict[str, Any]:
  """Forward and forward + backward ms (median of `steps` timed calls after two), and the
  largest difference of the forward from XLA's attention in float32."""
  import jax
  import jax.numpy as jnp
  b, t, n, h = shape
  keys = jax.random.split(jax.random.key(0), 4)
  q, k, v, ct = (jax.random.normal(key, shape, jnp.bfloat16) for key in keys)
  kernel = make(t, n)
  forward = jax.jit(kernel)
  loss = lambda q, k, v: jnp.sum(kernel(q, k, v).astype(jnp.float32) * ct)
  both = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
  out: dict[str, Any] = {}
  for name, fn in (('fwd', forward), ('fwd_bwd', both)):
    start = time.perf_counter()
    jax.block_until_ready(fn(q, k, v))
    out[f'{name}_compile_s'] = round(time.perf_counter() - start, 2)
    jax.block_until_ready(fn(q, k, v))
    times = []
    for _ in range(steps):
      start = time.perf_counter()
      jax.block_until_ready(fn(q, k, v))
      times.append(time.perf_counter() - start)
    out[f'{name}_ms'] = round(1e3 * common.median(times), 3)
  reference = _xla(t, n)(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32))
  out['max_abs_err'] = float(jnp.max(jnp.abs(forward(q, k, v).astype(jnp.float32) - reference)))
  flops = attention_flops(b, t, n, h)
  out['fwd_tflops'] = round(flops / out['fwd_ms'] / 1e9, 1)
  out['fwd_bwd_tflops'] = round(3 * flops / out['fwd_bwd_ms'] / 1e9, 1)
  return out


def main(argv: list[str] | None = None) -> None:
  parser = common.parser(__doc__, 'tiny shapes, interpreted kernels (tests)')
  parser.add_argument('--batch', type=int, default=6)
  parser.add_argument('--seq', type=int, default=2048)
  parser.add_argument('--heads', default='16x64', help='comma-separated NxH head shapes')
  parser.add_argument('--variants', default=DEFAULT)
  parser.add_argument('--steps', type=int, default=10)
  args = parser.parse_args(argv)
  import jax
  interpret = args.quick or jax.devices()[0].platform != 'tpu'
  if args.quick:
    args.batch, args.seq, args.heads, args.steps = 1, 256, '2x64', 2
    if args.variants == DEFAULT:
      args.variants = 'paxlike,splash_128,xla'
  table = variants(interpret)
  names = args.variants.split(',')
  unknown = [n for n in names if n not in table]
  if unknown:
    parser.error(f'unknown variant(s) {", ".join(unknown)}; known: {", ".join(table)}')
  result: dict[str, Any] = {'benchmark': 'attention_kernels', 'device': jax.devices()[0].device_kind,
                            'batch': args.batch, 'seq': args.seq, 'interpret': interpret,
                            'rows': {}}
  for heads in args.heads.split(','):
    n, h = (int(x) for x in heads.split('x'))
    for name in names:
      key = f'{heads}/{name}'
      try:
        result['rows'][key] = time_variant(table[name], (args.batch, args.seq, n, h), args.steps)
      except Exception as error:  # A kernel that cannot build or compile here: say why, go on.
        result['rows'][key] = {'error': f'{type(error).__name__}: '
                                        f'{str(error).strip().splitlines()[0][:200]}'}
      common.log(f'{key}: {result["rows"][key]}')
      common.emit(result)


if __name__ == '__main__':
  main()
