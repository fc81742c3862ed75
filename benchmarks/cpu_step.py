"""Whole-process steps/s of paxlike's CPU train step against a minimal flax.linen step.

    python -m benchmarks.cpu_step [--steps 20,120] [--repeats 3] [--mesh 4x2|8] [--quick]

The shape: a 2-layer d128 byte LM (4 heads, d_ff 512, vocab 256), seq 64, global batch 32,
float32, on a 4×2 ('data', 'model') mesh of 8 forced CPU devices. Two whole processes:
- `paxlike`: `python -m paxlike.main --exp=lm.StdlibTiny --fdl_fiddler=cpu8` with those
  overrides, in a fresh job dir (logs every 50 steps; eval and checkpoint only at the end);
  `--mesh 8` leaves the fiddler out: the default mesh, all 8 devices on 'data';
- `flax`: this file's `--child`: a minimal flax.linen LM of the same math (tied embeddings,
  RMSNorm, rope, causal attention, SwiGLU), AdamW, the batch sharded over 'data' and params
  replicated (as jit leaves them); random byte batches made on the host each step, ≤ 2 steps
  in flight.
Each runs at two lengths n1 < n2, timed from process start to exit, so start-up, compilation
and the final eval and save cancel: rate = (n2 - n1) / (t2 - t1). paxlike's two lengths run the
same programs (the schedule's numbers are optimizer state), which its compilation cache keeps
(and flax's, where JAX_COMPILATION_CACHE_DIR names one): an untimed n1-step run of each first
fills them, so that no timed run compiles what another will load. --quick (2 and 4 steps, one
repeat, no such runs) only shows the script runs: there a longer run may load what the shorter
compiled, and compilation no longer cancels. Repeats alternate the order; `ratio` is the
median of paxlike / flax rates over repeats. Goal: paxlike >= 12 steps/s at a load average
below 2 (1.6x Pax 1.4.0 on this shape; it was 10.3 before).
`cpu_ms_per_step` is each one's CPU time per step (every thread, by the same difference), and
`cpu_ratio` flax / paxlike of it: the work per step, which other users' load moves far less
than it moves wall time (both keep the 2 cores busy, so wall time is the machine's).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

from benchmarks import common

GOAL_STEPS_PER_SEC = 12.0
LAYERS, D_MODEL, HEADS, D_FF, VOCAB, SEQ, BATCH = 2, 128, 4, 512, 256, 64, 32
PAXLIKE_ARGS = ['--exp=lm.StdlibTiny',
                f'--fdl_set=model.num_layers={LAYERS}', f'--fdl_set=model.d_model={D_MODEL}',
                f'--fdl_set=model.num_heads={HEADS}', f'--fdl_set=model.d_ff={D_FF}',
                f'--fdl_set=data.seq_len={SEQ}', f'--fdl_set=data.batch_size={BATCH}']


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = common.parser(__doc__)
  parser.add_argument('--steps', default='20,120', help='the two run lengths n1,n2')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--mesh', choices=('4x2', '8'), default='4x2',
                      help="paxlike's mesh: 4x2 data x model (--fdl_fiddler=cpu8, tensor "
                           "parallel over 'model'), or 8: the default all-data mesh")
  parser.add_argument('--child', type=int, metavar='STEPS', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.quick:
    args.steps, args.repeats = '2,4', 1
  return args


def flax_setup() -> tuple[Any, Any, Callable[[], Any]]:
  """The baseline, as a user would write it: a jitted step of a minimal flax.linen LM, its
  initial (params, opt_state), and a function that returns the next sharded random batch."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  def rope(x):  # x[B, T, N, H], "rotate half".
    half = x.shape[-1] // 2
    angles = jnp.arange(x.shape[1])[:, None] * 10_000.0 ** (-jnp.arange(half) / half)
    sin, cos = jnp.sin(angles)[:, None], jnp.cos(angles)[:, None]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
      h = nn.RMSNorm()(x)
      q, k, v = (nn.DenseGeneral((HEADS, D_MODEL // HEADS), use_bias=False)(h) for _ in 'qkv')
      a = jax.nn.dot_product_attention(rope(q), rope(k), v, is_causal=True)
      x = x + nn.DenseGeneral(D_MODEL, axis=(-2, -1), use_bias=False)(a)
      h = nn.RMSNorm()(x)
      h = nn.silu(nn.Dense(D_FF, use_bias=False)(h)) * nn.Dense(D_FF, use_bias=False)(h)
      return x + nn.Dense(D_MODEL, use_bias=False)(h)

  class Lm(nn.Module):
    @nn.compact
    def __call__(self, tokens):
      embed = nn.Embed(VOCAB, D_MODEL)
      x = embed(tokens)
      for _ in range(LAYERS):
        x = Block()(x)
      return embed.attend(nn.RMSNorm()(x))

  mesh = jax.make_mesh((4, 2), ('data', 'model'), axis_types=(AxisType.Auto,) * 2)
  batch_sharding = NamedSharding(mesh, P(('data', 'model')))  # Data parallel on all 8.
  model, optimizer = Lm(), optax.adamw(3e-3)
  # Initialized replicated on the mesh, as the step returns them: its first call compiles the
  # program every later one runs (not a first one for single-device params).
  replicated = NamedSharding(mesh, P())
  params = jax.jit(model.init, out_shardings=replicated)(
      jax.random.key(0), jnp.zeros((1, SEQ), jnp.int32))['params']
  opt_state = jax.jit(optimizer.init, out_shardings=replicated)(params)

  @jax.jit
  def step(params, opt_state, tokens):
    def loss_fn(params):
      logits = model.apply({'params': params}, tokens[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  rng = np.random.default_rng(0)
  next_batch = lambda: jax.device_put(rng.integers(0, VOCAB, (BATCH, SEQ + 1), np.int32),
                                      batch_sharding)
  return step, (params, opt_state), next_batch


def flax_run(steps: int) -> None:
  """`steps` steps of the baseline, reading back each step's loss one step later."""
  step, state, next_batch = flax_setup()
  previous = None
  for _ in range(steps):
    *state, loss = step(*state, next_batch())
    if previous is not None:
      float(previous)
    previous = loss
  print(f'final loss {float(previous):.3f}', file=sys.stderr)


def whole_run(mode: str, steps: int, mesh: str = '4x2') -> tuple[float, float]:
  """Seconds from start to exit of a `mode` process that trains `steps` steps, and the CPU
  seconds (user + system, every thread) it used."""
  env = common.child_env(8)
  with tempfile.TemporaryDirectory(prefix='paxlike_cpu_step_') as job:
    if mode == 'paxlike':
      extra = ['--fdl_fiddler=cpu8'] if mesh == '4x2' else []
      command = ['-m', 'paxlike.main', *PAXLIKE_ARGS, *extra, f'--job_log_dir={job}',
                 f'--fdl_set=train.num_steps={steps}', '--fdl_set=train.log_every=50',
                 f'--fdl_set=train.eval_every={steps}', f'--fdl_set=train.checkpoint_every={steps}']
    else:
      command = common.rerun(__spec__, f'--child={steps}')
    cpu_before, start = _children_cpu_seconds(), time.perf_counter()
    proc = subprocess.run([sys.executable, *command], cwd=common.REPO, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed, cpu = time.perf_counter() - start, _children_cpu_seconds() - cpu_before
  if proc.returncode != 0:
    raise RuntimeError(f'{mode} run of {steps} steps exited {proc.returncode}: '
                       f'{proc.stderr[-2000:]}')
  return elapsed, cpu


def _children_cpu_seconds() -> float:
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  if args.child is not None:
    flax_run(args.child)
    return
  n1, n2 = (int(n) for n in args.steps.split(','))
  machine = common.machine()

  cpu_ms: dict[str, list[float]] = {'paxlike': [], 'flax': []}
  if not args.quick:  # Untimed: each one's programs into its compilation cache (see above).
    for mode in ('paxlike', 'flax'):
      whole_run(mode, n1, args.mesh)

  def rate(mode: str) -> float:
    (short, short_cpu), (long, long_cpu) = (whole_run(mode, n, args.mesh) for n in (n1, n2))
    common.log(f'  {mode}: {n1} steps {short:.2f}s ({short_cpu:.1f} CPU-s), '
               f'{n2} steps {long:.2f}s ({long_cpu:.1f} CPU-s)')
    cpu_ms[mode].append(1e3 * (long_cpu - short_cpu) / (n2 - n1))
    return (n2 - n1) / (long - short)

  values = common.alternate({'paxlike': lambda: rate('paxlike'),
                             'flax': lambda: rate('flax')}, args.repeats)
  paxlike = common.median(values['paxlike'])
  cpu = {mode: common.median(v) for mode, v in cpu_ms.items()}
  common.emit({
      'benchmark': 'cpu_step', 'steps': [n1, n2], 'repeats': args.repeats, 'machine': machine,
      'load_avg_1m_end': round(os.getloadavg()[0], 2),
      'shape': {'layers': LAYERS, 'd_model': D_MODEL, 'heads': HEADS, 'd_ff': D_FF,
                'vocab': VOCAB, 'seq_len': SEQ, 'batch': BATCH,
                'mesh': [4, 2] if args.mesh == '4x2' else [8]},
      'steps_per_sec': paxlike, 'flax_steps_per_sec': common.median(values['flax']),
      'ratio': common.paired_ratio(values['paxlike'], values['flax']),
      # CPU time per step (all threads, from the run-length difference): the work each does,
      # which the machine's load moves far less than it moves wall time.
      'cpu_ms_per_step': cpu, 'cpu_ratio': cpu['flax'] / cpu['paxlike'],
      'goal_steps_per_sec': GOAL_STEPS_PER_SEC, 'goal_met': paxlike >= GOAL_STEPS_PER_SEC,
      # A longer run that finished sooner: start-up noise swamped n2 - n1 steps (use more).
      'noise_dominated': any(r <= 0 for v in values.values() for r in v),
      'spread': {k: round(common.spread(v), 3) for k, v in values.items()},
  })


if __name__ == '__main__':
  main()
