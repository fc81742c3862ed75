"""MFU through the real trainer next to a bare jitted step of the same model, in one process,
on whatever accelerator there is (TPU or GPU; the peak comes from the device kind).

    python -m benchmarks.accelerator_mfu               # lm.Llama350M on a TPU (lm.Llama1B on a GPU)
    python -m benchmarks.accelerator_mfu --exp lm.Llama1B --fdl_set=data.batch_size=4
    python -m benchmarks.accelerator_mfu --only=bare --fdl_set=model.remat_policy=full  # a lever
    python -m benchmarks.accelerator_mfu --only=bare --profile /tmp/prof   # + where time goes
    python -m benchmarks.accelerator_mfu --only=federated   # the FedAvg round row alone
    python -m benchmarks.accelerator_mfu --quick       # tiny shapes on any device (CPU: tests)
    benchmarks/accelerator_mfu_cuda.sh                 # NVIDIA only: makes a CUDA venv, runs this
    benchmarks/device_check.sh                         # every accelerator part, TPU or GPU

trainer: `build.setup(task)`'s compiled step fed as `loop.train` feeds it: batches from the
task's data source through the prefetcher and `loop.round_inputs` (sharding, client weights,
per-step rng), the previous step's metrics read back to the host and checked for finiteness
(≤ 2 steps in flight). bare: the same model and optimizer (`task.optimizer`) in a plain
`jax.jit` step (mean cross-entropy, grads, update; params and optimizer state donated unless
`--no-donate`) on one fixed on-device batch. `ratio` = trainer / bare steps per second (goal
≥ 0.97). federated: `federated.ShakespeareFedAvg` with the 125M LM (`size_125m`), cohort 16
(all at once needed 38.5 GB of temporaries on a v5e; the trainer then retries with fewer
clients at a time until XLA's figure fits, said on stderr), 4 local steps, timed like the
trainer; its FLOPs count every client's every local step. A side
that fails (e.g. out of memory) is reported as `trainer_error` / `bare_error` (one line); the
other still runs.

`--profile DIR`: after timing, a `jax.profiler` trace of `--profile-steps` bare steps into DIR,
summarized into `lm.profile` (benchmarks/profile_summary.py: device time per step by category,
matmul, splash attention, fusions, copies, collectives, host, and the top ops by self time).

MFU = model FLOPs (6·N + causal attention per token, `paxlike.families.lm_flops`; remat recompute is
not counted) × steps/s over the chips' bf16 peak (`paxlike.trainer.throughput`, or `--peak-tflops`);
null where the peak is unknown (CPU). Prints one JSON object. On CPU (without --quick) it prints a
`skipped` object and exits 0, so `make bench` passes there.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import common

# --quick: a 2-layer d64 model at seq 32 (LM) and a 4-client, 2-local-step round (federated).
QUICK_MODEL = ['model.num_layers=2', 'model.d_model=64', 'model.num_heads=4',
               'model.num_kv_heads=2', 'model.d_ff=128', 'model.vocab_size=256']
QUICK_LM = [*QUICK_MODEL, 'data.seq_len=32', 'data.batch_size=8', 'data.eval_batch_size=8',
            'data.num_eval_batches=1']
QUICK_FEDERATED = [*QUICK_MODEL, 'data.clients_per_round=4', 'data.local_steps=2']
FEDERATED = ['data.clients_per_round=16', 'data.local_steps=4']


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = common.parser(__doc__, 'tiny shapes on whatever device there is (CPU here)',
                         quick_aliases=('--dry-run',))
  parser.add_argument('--exp', help='default: lm.Llama1B on a GPU, else lm.Llama350M')
  parser.add_argument('--fdl_set', action='append', default=[], help='PATH=VALUE (repeatable)')
  parser.add_argument('--fiddler', action='append', default=[],
                      help='a paxlike/configs/fiddlers.py name, applied before --fdl_set '
                      '(repeatable)')
  parser.add_argument('--only', choices=('both', 'trainer', 'bare', 'federated'), default='both')
  parser.add_argument('--no-federated', dest='federated', action='store_false')
  parser.add_argument('--no-donate', dest='donate', action='store_false',
                      help="bare step: don't donate params and optimizer state")
  parser.add_argument('--steps', type=int, default=10, help='timed steps of each')
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--profile', type=Path, help='trace bare steps into DIR and summarize')
  parser.add_argument('--profile-steps', type=int, default=3)
  parser.add_argument('--peak-tflops', type=float,
                      help="the chip's dense bf16 peak (default: paxlike.trainer.throughput's table)")
  args = parser.parse_args(argv)
  if args.quick:
    args.steps, args.warmup = 3, 1
  if args.profile and args.only in ('trainer', 'federated'):
    parser.error('--profile traces the bare step: use it with --only both or bare')
  return args


def task_of(exp: str, fiddlers: list[str], overrides: list[str]) -> Any:
  """The built task of a registered experiment, after fiddlers and PATH=VALUE overrides."""
  from paxlike.configs import fiddlers as fiddler_lib
  from paxlike import registry
  from paxlike.config import config_io
  registry.import_all()
  cfg = registry.get(exp)().config()
  for name in fiddlers:
    getattr(fiddler_lib, name)(cfg)
  config_io.apply_overrides(cfg, overrides)
  return config_io.build(cfg)


def trainer_seconds_per_step(s: Any, warmup: int, steps: int) -> float:
  """Seconds per step of `s.step` fed as the train loop feeds it (see the module docstring)."""
  import flax.linen as nn
  import jax
  import numpy as np
  from paxlike.core import partitioning
  from paxlike.trainer import build, loop
  from paxlike.data.prefetch import Prefetcher
  state = s.program.init(jax.random.key(s.task.train.seed))
  rules = partitioning.rules_for_mesh(s.task.mesh.rules, s.program.mesh)
  with (jax.set_mesh(s.program.mesh), nn.logical_axis_rules(rules),
        Prefetcher(functools.partial(loop.host_round, s), 1) as rounds):

    def run(first: int, n: int) -> float:
      nonlocal state
      began, pending = time.perf_counter(), None
      for step in range(first, first + n):
        state, metrics = s.step(state, *loop.round_inputs(s, step, rounds.get(step)))
        if pending is not None:
          assert np.isfinite(jax.device_get(pending)['loss'])
        pending = metrics
      assert np.isfinite(jax.device_get(pending)['loss'])
      return time.perf_counter() - began

    run(1, warmup)
    return run(1 + warmup, steps) / steps


def bare_step(task: Any, donate: bool) -> Any:
  """`one()`: a plain jitted train step of `task.model` and `task.optimizer` on one fixed
  batch (its state kept in the closure); returns the step's loss."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import optax
  model, optimizer, data = task.model, task.optimizer, task.data
  tokens = jax.random.randint(jax.random.key(1), (data.batch_size, data.seq_len + 1), 0,
                              min(256, model.vocab_size), dtype=jnp.int32)
  params = jax.jit(lambda key: nn.meta.unbox(model.init(key, tokens[:1, :-1])['params']))(
      jax.random.key(0))
  state = (params, jax.jit(optimizer.init)(params))

  def loss_fn(params, tokens):
    logits = model.apply({'params': params}, tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

  @functools.partial(jax.jit, donate_argnums=(0,) if donate else ())
  def step(state, tokens):
    params, opt_state = state
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  def one():
    nonlocal state
    state, loss = step(state, tokens)
    return loss

  one.compile = lambda: step.lower(state, tokens).compile()  # For its memory figures.
  return one


def one_line(error: BaseException) -> str:
  """An exception as one line (XLA's out-of-memory messages run to pages)."""
  lines = [l.strip() for l in str(error).strip().splitlines() if l.strip()]
  return f'{type(error).__name__}: {lines[0][:400] if lines else ""}'


def time_trainer(task: Any, args: argparse.Namespace, row: dict[str, Any], mfu: Any) -> None:
  """The trainer's set-up and steps/s into `row`."""
  from paxlike.trainer import build
  began = time.time()
  # --quick leaves out the eval step, which nothing here runs; a full run's `setup_s` times
  # all of the trainer's set-up, its eval step included.
  s = build.setup(task, evaluator=not args.quick)
  row.update({'devices': s.program.mesh.size, 'round_shape': list(s.program.round_shape),
              s.reporters.item + '_per_step': s.reporters.items_per_step,
              'flops_per_step': s.reporters.flops_per_device * s.program.mesh.size,  # Every client, local step.
              'setup_s': round(time.time() - began, 1)})
  rate = 1 / trainer_seconds_per_step(s, args.warmup, args.steps)
  row.update(trainer_steps_per_sec=rate, trainer_mfu=mfu(rate, s.program.mesh.size))


def time_bare(task: Any, args: argparse.Namespace, row: dict[str, Any], mfu: Any) -> None:
  """The bare step's steps/s into `row`, then (with --profile) where its time goes."""
  from benchmarks import profile_summary
  began = time.time()
  one = bare_step(task, args.donate)
  common.timed_loop(one, args.warmup)
  row['bare_setup_s'] = round(time.time() - began, 1)
  rate = args.steps / common.timed_loop(one, args.steps)
  row.update(bare_steps_per_sec=rate, bare_mfu=mfu(rate, 1), donate=args.donate)
  row.update(memory_gb(task, one, row['attention_kernel']))
  if args.profile:
    common.log(f'accelerator_mfu: profiling {args.profile_steps} bare steps into {args.profile}')
    wall = profile_summary.trace(one, args.profile, args.profile_steps)
    row['profile'] = {'dir': str(args.profile),
                      **profile_summary.summarize(args.profile, args.profile_steps, wall_s=wall)}


def memory_gb(task: Any, one: Any, kernel: str) -> dict[str, float]:
  """XLA's figures for the compiled bare step (its peak where the platform reports one; a
  second compile, from the persistent cache where one is set) beside print_config's estimate
  for one device (`lm_memory.estimate`)."""
  from paxlike.families import lm_memory
  stats = one.compile().memory_analysis()
  out = {'estimate_gb': lm_memory.estimate(task, 1, kernel=kernel).total / 1e9}
  if stats is not None:
    out['xla_temp_gb'] = stats.temp_size_in_bytes / 1e9
    out['xla_args_gb'] = stats.argument_size_in_bytes / 1e9
    if getattr(stats, 'peak_memory_in_bytes', None):
      out['xla_peak_gb'] = stats.peak_memory_in_bytes / 1e9
  return {key: round(value, 3) for key, value in out.items()}


def measure(task: Any, args: argparse.Namespace, peak: float | None, bare: bool = True,
            trainer: bool = True) -> dict[str, Any]:
  """Trainer and/or bare steps/s and MFU of `task`, and their ratio. A side that raises (out
  of memory, say) is reported as `{side}_error`, and the other side still runs."""
  import gc
  from paxlike.families import lm_flops
  data = task.data
  tokens = data.batch_size * data.seq_len
  row: dict[str, Any] = {
      'attention_kernel': task.model.attention_kernel(data.seq_len),
      'remat_policy': task.model.remat_policy, 'scan_layers': task.model.scan_layers,
      'batch_size': data.batch_size, 'seq_len': data.seq_len,
      'flops_per_step': lm_flops.flops_per_token(task.model, data.seq_len) * tokens}
  mfu = lambda rate, devices: peak and row['flops_per_step'] * rate / (peak * devices)
  sides = [(name, fn) for name, fn, on in (('trainer', time_trainer, trainer),
                                           ('bare', time_bare, bare)) if on]
  for name, fn in sides:
    try:
      fn(task, args, row, mfu)
    except Exception as error:  # noqa: BLE001 (reported; the other side still runs)
      from paxlike.errors import UserError
      if isinstance(error, UserError):
        raise
      row[f'{name}_error'] = one_line(error)
      common.log(f'accelerator_mfu: {name} failed: {row[name + "_error"]}')
    gc.collect()  # Frees the side's device buffers before the next side allocates its own.
  if 'trainer_steps_per_sec' in row and 'bare_steps_per_sec' in row:
    row['ratio'] = row['trainer_steps_per_sec'] / row['bare_steps_per_sec']
  return row


def main(argv: list[str] | None = None) -> int:
  from paxlike.errors import UserError
  try:
    return run(parse_args(argv))
  except UserError as error:  # A config the platform can't run: one line, as the CLI does.
    print(f'accelerator_mfu: error: {error}', file=sys.stderr)
    return 2


def default_exp(platform: str) -> str:
  """lm.Llama1B on a GPU (an H200 holds it), lm.Llama350M elsewhere (one TPU v5e chip's HBM)."""
  return 'lm.Llama1B' if platform == 'gpu' else 'lm.Llama350M'


def run(args: argparse.Namespace) -> int:
  import jax
  from paxlike.trainer import throughput
  device = jax.devices()[0]
  args.exp = args.exp or default_exp(device.platform)
  base = {'benchmark': 'accelerator_mfu', 'device_kind': device.device_kind,
          'platform': device.platform, 'jax': jax.__version__, 'quick': args.quick,
          'exp': args.exp, 'fdl_set': args.fdl_set}
  if device.platform == 'cpu' and not args.quick:
    common.emit({**base, 'skipped': 'no accelerator: run it on a TPU or GPU '
                 '(benchmarks/device_check.sh), or --quick for a tiny check on any device'})
    return 0
  peak = (args.peak_tflops * 1e12 if args.peak_tflops
          else throughput.peak_flops_per_sec(device.device_kind))
  out = {**base, 'peak_tflops': peak and peak / 1e12}
  if args.only != 'federated':
    task = task_of(args.exp, args.fiddler, [*(QUICK_LM if args.quick else []), *args.fdl_set])
    common.log(f'accelerator_mfu: {args.exp} on {device.device_kind}')
    out['lm'] = measure(task, args, peak, bare=args.only != 'trainer',
                        trainer=args.only != 'bare')
    del task
  if args.federated and args.only in ('both', 'federated'):
    common.log('accelerator_mfu: federated.ShakespeareFedAvg, 125M LM')
    fed = task_of('federated.ShakespeareFedAvg', ['size_125m'],
                  QUICK_FEDERATED if args.quick else FEDERATED)
    out['federated'] = {'exp': 'federated.ShakespeareFedAvg', 'size': '125m',
                        **measure(fed, args, peak, bare=False)}
  common.emit(out)
  return 0


if __name__ == '__main__':
  sys.exit(main())
