"""Step time with async Orbax checkpoints every 10 steps against none.

    python -m benchmarks.checkpoint_cost [--exp lm.StdlibTiny] [--steps 30] [--every 10] [--quick]

Runs the trainer's loop shape on `build.setup(task)`: `round_inputs` then `Trainer.step` each
step, reading back the previous step's metrics (≤ 2 in flight); on a checkpoint step it reads
back the current metrics and calls `paxlike.trainer.checkpoint.Checkpoints.save` (async: it returns once
the state is copied to host, and Orbax writes in the background). Repeats alternate between
`none`, `sync_only` (the read-back every 10 steps, no save) and `async`; each timed window ends
after its last step, then (untimed) waits for the saves still in flight, so no background write
spills into the next window. `ratio` is async / none step time (median of the repeats' ratios;
`ratio_best`: best window over best window). Goal: <= 1.03.
`extra_ms_per_step` splits the difference into the read-back, the blocking part of `save()`
(`save_call_ms` per save) and the rest (background writes); `--profile FILE` writes a cProfile
of one extra `async` window (main thread only) and logs its top entries; `--saves_only N`
runs N saves back to back and prints their CPU ms per save, for a profiler that sees every
thread (`py-spy record -r 250 -f raw -o RAW -- python -m benchmarks.checkpoint_cost
--saves_only 40`), and `--pyspy_raw RAW --pyspy_rate 250 --saves_only 40` sums that profile's
busy Python time per save by thread and by function.
`save_cpu_ms` is the CPU time (all threads) one save costs, measured alone after the windows;
`save_cpu_share` puts it against the CPU the machine has while `every` steps run
(cores x every x the `none` step time): where the step keeps every core busy, a background save
can hide nothing, and `ratio` stays near 1 + that share however little of it blocks the loop.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import os
import pstats
import re
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common

GOAL = 1.03


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = common.parser(__doc__)
  parser.add_argument('--exp', default='lm.StdlibTiny')
  parser.add_argument('--set', action='append', default=[], metavar='PATH=VALUE')
  parser.add_argument('--steps', type=int, default=30, help='steps per timed window')
  parser.add_argument('--every', type=int, default=10, help='checkpoint interval in steps')
  parser.add_argument('--repeats', type=int, default=8)
  parser.add_argument('--profile', type=Path, help='write a cProfile of one async window here')
  parser.add_argument('--saves_only', type=int, default=0, metavar='N',
                      help='no timed windows: N saves back to back (for an outside profiler)')
  parser.add_argument('--pyspy_raw', type=Path, metavar='FILE',
                      help="summarize FILE (py-spy's raw output of a --saves_only run) and exit")
  parser.add_argument('--pyspy_rate', type=int, default=100, help='its samples per second')
  args = parser.parse_args(argv)
  if args.quick:
    args.steps, args.every, args.repeats = 4, 2, 1
    args.set = ['model.num_layers=1', *args.set]
  return args


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  if args.pyspy_raw:
    common.emit(busy_threads(args.pyspy_raw.read_text(), args.pyspy_rate, args.saves_only + 1))
    return
  machine = common.machine()
  import jax
  from paxlike import registry
  from paxlike.trainer import build, checkpoint, loop
  from paxlike.config import config_io
  from paxlike.trainer.checkpoint import Checkpoints

  registry.import_all()
  cfg = registry.get(args.exp)().config()
  config_io.apply_overrides(cfg, args.set)
  task = config_io.build(cfg)
  s = build.setup(task, evaluator=False)  # Nothing here evaluates.
  with jax.set_mesh(s.program.mesh):
    run = {'state': s.program.init(jax.random.key(task.train.seed)), 'step': 0}
  save_calls: list[float] = []

  def window(checkpoints: Checkpoints | None, sync: bool = False) -> float:
    """Steps/s of `args.steps` trainer-shaped steps; every `args.every` steps, with `sync` or
    `checkpoints`, it reads back that step's metrics (the trainer's sync before a save), and
    with `checkpoints` it also saves."""
    state, first = run['state'], run['step'] + 1
    start = time.perf_counter()
    pending = None
    for step in range(first, first + args.steps):
      state, metrics = s.step(state, *loop.round_inputs(s, step))
      if pending is not None:
        jax.device_get(pending)
      pending = metrics
      if (sync or checkpoints is not None) and step % args.every == 0:
        jax.device_get(pending)
        pending = None
      if checkpoints is not None and step % args.every == 0:
        began = time.perf_counter()
        checkpoints.save(step, state, {'step': step, 'data': checkpoint.data_position(0, step)})
        save_calls.append(time.perf_counter() - began)
    if pending is not None:
      jax.device_get(pending)
    elapsed = time.perf_counter() - start
    run['state'], run['step'] = state, first + args.steps - 1
    if checkpoints is not None:
      checkpoints.wait()
    return args.steps / elapsed

  with tempfile.TemporaryDirectory(prefix='paxlike_ckpt_bench_') as directory:
    checkpoints = Checkpoints(Path(directory) / 'checkpoints', max_to_keep=3)
    if args.saves_only:
      saves_alone(checkpoints, run['state'], args.saves_only)
      return
    try:
      window(None)  # Warm up the step, then the first (slow) save.
      window(checkpoints)
      save_calls.clear()
      values = common.alternate({'none': lambda: window(None),
                                 'sync_only': lambda: window(None, sync=True),
                                 'async': lambda: window(checkpoints)}, args.repeats)
      if args.profile:
        profile(lambda: window(checkpoints), args.profile)
      save_cpu_ms = cpu_ms_per_save(checkpoints, run['state'], run['step'])
    finally:
      checkpoints.close()
  ratio = common.paired_ratio(values['none'], values['async'])
  ms = {k: 1e3 / common.median(v) for k, v in values.items()}
  save_ms = 1e3 * common.median(save_calls)
  blocking = save_ms / args.every
  common.emit({
      'benchmark': 'checkpoint_cost', 'experiment': args.exp, 'overrides': args.set,
      'steps': args.steps, 'every': args.every, 'repeats': args.repeats, 'machine': machine,
      'ratio': ratio, 'ratio_best': max(values['none']) / max(values['async']),
      'goal': GOAL, 'goal_met': ratio <= GOAL,
      'steps_per_sec': common.median(values['async']),
      'baseline_steps_per_sec': common.median(values['none']),
      'step_time_ms': ms, 'save_call_ms': save_ms, 'saves': len(save_calls),
      # Where the extra time per step goes: the read-back before each save (sync_only - none),
      # the blocking part of save(), and the rest (Orbax's background writes sharing the CPU).
      'extra_ms_per_step': {'sync': ms['sync_only'] - ms['none'], 'save_call': blocking,
                            'background': ms['async'] - ms['sync_only'] - blocking},
      'save_cpu_ms': save_cpu_ms,
      'save_cpu_share': save_cpu_ms / (os.cpu_count() * args.every * ms['none']),
      'spread': {k: round(common.spread(v), 3) for k, v in values.items()},
  })


def cpu_ms_per_save(checkpoints, state, last_step: int, saves: int = 4) -> float:
  """Process CPU time (every thread's: Orbax's writers, tensorstore, the save thread) per
  save-and-commit of `state`, with nothing else running."""
  from paxlike.trainer import checkpoint
  def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
  start = cpu_seconds()
  for step in range(last_step + 1, last_step + 1 + saves):
    checkpoints.save(step, state, {'step': step, 'data': checkpoint.data_position(0, step)})
    checkpoints.wait()
  return 1e3 * (cpu_seconds() - start) / saves


def saves_alone(checkpoints, state, saves: int) -> None:
  """One untimed save (its one-off work), then `saves` saves back to back: prints their CPU ms
  per save and closes `checkpoints`."""
  import jax
  try:
    cpu_ms_per_save(checkpoints, state, 0, 1)
    common.emit({'benchmark': 'checkpoint_cost', 'saves': saves,
                 'leaves': len(jax.tree.leaves(state)),
                 'save_cpu_ms': cpu_ms_per_save(checkpoints, state, 1, saves)})
  finally:
    checkpoints.close()


IDLE = re.compile(r'(Condition\.wait|_worker|\w*Selector\.select|Thread\._wait_for_tstate_lock'
                  r'|wait) \(')


def busy_threads(raw: str, rate: int, saves: int, top: int = 12) -> dict[str, Any]:
  """Where a --saves_only run's Python time went, from py-spy's raw stacks: busy ms per save
  by thread (Orbax names its threads by stage) and by innermost function; the main thread
  counts only inside the saves, and samples parked in a wait or an idle worker not at all."""
  threads: collections.Counter = collections.Counter()
  leaves: collections.Counter = collections.Counter()
  for line in raw.splitlines():
    stack, _, count = line.rpartition(' ')
    frames = stack.split(';')
    main_thread = 'MainThread' in frames[0] or frames[1:2] == ['<module>'] or any(
        f.startswith('<module> (') for f in frames[1:2])
    if len(frames) < 2 or IDLE.match(frames[-1]) or (
        main_thread and not any('cpu_ms_per_save' in f for f in frames)):
      continue
    threads[re.sub(r'\(\d+\):?\s*|^thread\s*', '', frames[0]) or 'unnamed'] += int(count)
    leaves[re.sub(r':\d+\)', ')', frames[-1])] += int(count)
  per_save = 1e3 / rate / saves
  return {'busy_ms_per_save': round(sum(threads.values()) * per_save, 1),
          'by_thread_ms': {k: round(v * per_save, 1) for k, v in threads.most_common(top)},
          'by_function_ms': {k: round(v * per_save, 1) for k, v in leaves.most_common(top)}}


def profile(fn, path: Path) -> None:
  """Runs `fn` under cProfile, writes the stats to `path` and logs the top entries."""
  profiler = cProfile.Profile()
  profiler.runcall(fn)
  profiler.dump_stats(str(path))
  text = io.StringIO()
  pstats.Stats(profiler, stream=text).sort_stats('cumulative').print_stats(25)
  common.log(text.getvalue())


if __name__ == '__main__':
  main()
