"""MFU through the real trainer next to a bare jitted step of the same model, in one process.

    python benchmarks/gpu_mfu.py                       # lm.Llama1B + the federated row, on a GPU
    python benchmarks/gpu_mfu.py --fdl_set=model.remat_policy=none --only=bare   # one lever
    python benchmarks/gpu_mfu.py --quick               # tiny shapes on any device (CPU: tests)
    benchmarks/gpu_mfu.sh                              # makes a CUDA venv first, then runs this

trainer: `build.setup(task)`'s compiled step fed as `loop.train` feeds it: batches from the
task's data source through the prefetcher and `loop.round_inputs` (sharding, client weights,
per-step rng), the previous step's metrics read back to the host and checked for finiteness
(≤ 2 steps in flight). bare: the same model and optimizer (`task.optimizer`) in a plain
`jax.jit` step (mean cross-entropy, grads, update; params and optimizer state donated unless
`--no-donate`) on one fixed on-device batch. `ratio` = trainer / bare steps per second (goal
≥ 0.97). federated: `federated.ShakespeareFedAvg` with the 125M LM (`size_125m`), cohort 16,
4 local steps, timed like the trainer; its FLOPs count every client's every local step.

MFU = model FLOPs (6·N + causal attention per token, `paxlike.families.lm_flops`; remat recompute is
not counted) × steps/s over the chips' bf16 peak (`paxlike.trainer.throughput`, or `--peak-tflops`);
null where the peak is unknown (CPU). Prints one JSON object. Without a GPU (and without
--quick) it prints a `skipped` object and exits 0, so `make bench` passes on CPU.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402

# --quick: a 2-layer d64 model at seq 32 (LM) and a 4-client, 2-local-step round (federated).
QUICK_MODEL = ['model.num_layers=2', 'model.d_model=64', 'model.num_heads=4',
               'model.num_kv_heads=2', 'model.d_ff=128', 'model.vocab_size=256']
QUICK_LM = [*QUICK_MODEL, 'data.seq_len=32', 'data.batch_size=8', 'data.eval_batch_size=8',
            'data.num_eval_batches=1']
QUICK_FEDERATED = [*QUICK_MODEL, 'data.clients_per_round=4', 'data.local_steps=2']
FEDERATED = ['data.clients_per_round=16', 'data.local_steps=4']


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--exp', default='lm.Llama1B')
  parser.add_argument('--fdl_set', action='append', default=[], help='PATH=VALUE (repeatable)')
  parser.add_argument('--only', choices=('both', 'trainer', 'bare'), default='both')
  parser.add_argument('--no-federated', dest='federated', action='store_false')
  parser.add_argument('--no-donate', dest='donate', action='store_false',
                      help="bare step: don't donate params and optimizer state")
  parser.add_argument('--steps', type=int, default=10, help='timed steps of each')
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--peak-tflops', type=float,
                      help="the chip's dense bf16 peak (default: paxlike.trainer.throughput's table)")
  parser.add_argument('--quick', '--dry-run', dest='quick', action='store_true',
                      help='tiny shapes on whatever device there is (CPU here)')
  args = parser.parse_args(argv)
  if args.quick:
    args.steps, args.warmup = 3, 1
  return args


def task_of(exp: str, fiddlers: list[str], overrides: list[str]) -> Any:
  """The built task of a registered experiment, after fiddlers and PATH=VALUE overrides."""
  from configs import fiddlers as fiddler_lib
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


def bare_seconds_per_step(task: Any, donate: bool, warmup: int, steps: int) -> float:
  """Seconds per step of a plain jitted train step of `task.model` and `task.optimizer`."""
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

  common.timed_loop(one, warmup)
  return common.timed_loop(one, steps) / steps


def measure(task: Any, args: argparse.Namespace, peak: float | None, bare: bool = True,
            trainer: bool = True) -> dict[str, Any]:
  """Trainer and/or bare steps/s and MFU of `task`, and their ratio."""
  from paxlike.families import lm_flops
  from paxlike.trainer import build, loop
  data = task.data
  tokens = data.batch_size * data.seq_len
  row: dict[str, Any] = {
      'attention_kernel': task.model.attention_kernel(data.seq_len),
      'remat_policy': task.model.remat_policy, 'batch_size': data.batch_size,
      'seq_len': data.seq_len,
      'flops_per_step': lm_flops.flops_per_token(task.model, data.seq_len) * tokens}
  mfu = lambda rate, devices: peak and row['flops_per_step'] * rate / (peak * devices)
  if trainer:
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
    del s
  if bare:
    rate = 1 / bare_seconds_per_step(task, args.donate, args.warmup, args.steps)
    row.update(bare_steps_per_sec=rate, bare_mfu=mfu(rate, 1), donate=args.donate)
  if trainer and bare:
    row['ratio'] = row['trainer_steps_per_sec'] / row['bare_steps_per_sec']
  return row


def main(argv: list[str] | None = None) -> int:
  from paxlike.errors import UserError
  try:
    return run(parse_args(argv))
  except UserError as error:  # A config the platform can't run: one line, as the CLI does.
    print(f'gpu_mfu: error: {error}', file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
  import jax
  from paxlike.trainer import throughput
  device = jax.devices()[0]
  base = {'benchmark': 'gpu_mfu', 'device_kind': device.device_kind, 'platform': device.platform,
          'jax': jax.__version__, 'quick': args.quick, 'exp': args.exp, 'fdl_set': args.fdl_set}
  if device.platform != 'gpu' and not args.quick:
    common.emit({**base, 'skipped': 'no GPU: run benchmarks/gpu_mfu.sh on an H100/H200, '
                 'or --quick for a tiny check on any device'})
    return 0
  peak = (args.peak_tflops * 1e12 if args.peak_tflops
          else throughput.peak_flops_per_sec(device.device_kind))
  task = task_of(args.exp, [], [*(QUICK_LM if args.quick else []), *args.fdl_set])
  common.log(f'gpu_mfu: {args.exp} on {device.device_kind}')
  out = {**base, 'peak_tflops': peak and peak / 1e12,
         'lm': measure(task, args, peak, bare=args.only != 'trainer',
                       trainer=args.only != 'bare')}
  if args.federated and args.only == 'both':
    common.log('gpu_mfu: federated.ShakespeareFedAvg, 125M LM')
    fed = task_of('federated.ShakespeareFedAvg', ['size_125m'],
                  QUICK_FEDERATED if args.quick else FEDERATED)
    out['federated'] = {'exp': 'federated.ShakespeareFedAvg', 'size': '125m',
                        **measure(fed, args, peak, bare=False)}
  common.emit(out)
  return 0


if __name__ == '__main__':
  sys.exit(main())
