"""GPipe's measured bubble fraction against its formula (p - 1) / (m + p - 1).

    python -m benchmarks.pipeline [--stages 2,4] [--microbatches 4,8] [--steps 1] [--repeats 5]
                                  [--circular R]   # also the circular schedule of R passes
    python -m benchmarks.pipeline --quick      # 2 stages, 2 and 4 microbatches, tiny (tests)

A child on 8 forced CPU devices times a train step (forward and backward, jit) of a residual
MLP stack (`--layers` layers, d `--d`, hidden 4d, microbatches of `--rows` rows x `--tokens`
tokens) on a (stage p, data 8/p) mesh, two ways, in alternating repeats:
- `pipelined`: `paxlike.layers.pipeline.pipelined_layers`, m microbatches, m + p - 1 iterations
  (circular: r m + p - 1, formula (p - 1) / (r m + p - 1));
- `no_bubble`: the same shard_map over 'stage' where each stage scans its own layers over the
  same m microbatches with no dependency on the previous stage: the useful work of the
  pipeline alone, without fill, drain or ppermute.
Measured bubble = 1 - no_bubble / pipelined (median over repeats of the paired ratios), in this
process's CPU time: the share of the pipelined step's work that is not the m microbatch-stages
each stage must run (fill, drain, ppermutes, bookkeeping). A stage in its bubble computes on a
placeholder (as MaxText's does), so the bubble is work, and CPU time counts it whatever else runs
on the host; on forced CPU devices that share a few cores with other jobs, wall time is noisy
(`bubble_measured_wall` beside it). On an accelerator, bubble iterations cost device time the
same way: one microbatch-stage each, which is what the formula counts.
Cross-check (`slope`), from pipelined steps alone: at a fixed microbatch size a step costs
c (m + p - 1) + o; c from the two smallest m gives 1 - m c / T(m), which counts the fixed
per-step cost o (the data-parallel gradient all-reduce, the output psum: `cpu_ms_fixed`) as
bubble too, so it reads above the formula by about o / T; `bubble_measured` cancels o, which
the no_bubble step pays as well.
Prints one JSON object: per (stages, microbatches) the step times, `bubble_measured`,
`bubble_gpipe`, `relative_error` = |measured - formula| / formula, `within_20pct`.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from benchmarks import common

DEVICES = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = common.parser(__doc__)
  parser.add_argument('--stages', default='2,4')
  parser.add_argument('--microbatches', default='4,8')
  parser.add_argument('--layers', type=int, default=8)
  parser.add_argument('--d', type=int, default=256)
  parser.add_argument('--rows', type=int, default=8, help='rows per microbatch')
  parser.add_argument('--tokens', type=int, default=128, help='tokens per row')
  parser.add_argument('--steps', type=int, default=1, help='steps per timed repeat')
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--circular', type=int, default=1,
                      help='also time the circular schedule with this many passes (> 1)')
  parser.add_argument('--child', action='store_true', help=argparse.SUPPRESS)  # Internal.
  args = parser.parse_args(argv)
  if args.quick:
    args.stages, args.microbatches, args.layers, args.d = '2', '2,4', 4, 32
    args.tokens, args.steps, args.repeats = 4, 1, 1
  return args


def _layer(p, x, extra):
  """One residual MLP layer: x + tanh(x wi) wo."""
  import jax.numpy as jnp
  return x + jnp.tanh(x @ p['wi']) @ p['wo']


def _steps(args: argparse.Namespace, p: int, m: int, r: int = 1):
  """(pipelined with r passes, no_bubble) jitted train steps and their (params, x) on a
  (p, 8/p) mesh."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
  from paxlike.layers import pipeline
  mesh = jax.make_mesh((p, DEVICES // p), ('stage', 'data'), axis_types=(AxisType.Auto,) * 2)
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  d, L = args.d, args.layers
  params = {'wi': jax.random.normal(k1, (L, d, 4 * d)) / d**0.5,
            'wo': jax.random.normal(k2, (L, 4 * d, d)) / (2 * d**0.5)}
  x = jax.random.normal(k3, (m * args.rows, args.tokens, d))
  params = jax.device_put(params, NamedSharding(mesh, P('stage')))
  x = jax.device_put(x, NamedSharding(mesh, P('data')))

  def piped(params, x):
    y = pipeline.pipelined_layers(_layer, params, x, microbatches=m, mesh=mesh, repeats=r)
    return jnp.mean(y ** 2)

  def stage_work(params, x):
    # Microbatch j = rows j, j + m, ... as in the pipeline: each data shard splits its own rows.
    xs = jnp.swapaxes(x.reshape(x.shape[0] // m, m, *x.shape[1:]), 0, 1)
    xs = lax.pcast(xs, ('stage',), to='varying')
    ys = lax.map(lambda h: pipeline.scan_layers(_layer, params, h), xs)
    return lax.psum(jnp.mean(ys ** 2), 'stage')

  no_bubble = jax.shard_map(stage_work, mesh=mesh, in_specs=(P('stage'), P()), out_specs=P(),
                            axis_names={'stage'})
  grad = lambda f: jax.jit(jax.value_and_grad(f))
  return grad(piped), grad(no_bubble), params, x


def _timed(step, params, x, steps: int) -> tuple[float, float]:
  """(wall, process CPU) seconds of `steps` steps, <= 2 in flight as `common.timed_loop`."""
  import jax
  wall, cpu = time.perf_counter(), time.process_time()
  previous = None
  for _ in range(steps):
    out = step(params, x)
    if previous is not None:
      jax.block_until_ready(previous)
    previous = out
  jax.block_until_ready(previous)
  return time.perf_counter() - wall, time.process_time() - cpu


def _bubble(no_bubble: list[float], pipelined: list[float]) -> float:
  return 1 - common.paired_ratio(no_bubble, pipelined)


def point(args: argparse.Namespace, p: int, m: int, r: int = 1) -> dict[str, Any]:
  """One (stages, microbatches, repeats) point: step times and the measured bubble."""
  import jax
  from paxlike.layers import pipeline
  piped, no_bubble, params, x = _steps(args, p, m, r)
  steps = {'pipelined': piped, 'no_bubble': no_bubble}
  for step in steps.values():
    jax.block_until_ready(step(params, x))  # Compile.
  times: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
  for i in range(args.repeats):  # A B, B A, ...: drifting load falls on both sides.
    for name in (list(steps) if i % 2 == 0 else list(steps)[::-1]):
      times[name].append(_timed(steps[name], params, x, args.steps))
  common.log(f'stages={p} microbatches={m} repeats={r}: {times}')
  wall = {name: [t[0] for t in ts] for name, ts in times.items()}
  cpu = {name: [t[1] for t in ts] for name, ts in times.items()}
  measured = _bubble(cpu['no_bubble'], cpu['pipelined'])
  formula = pipeline.bubble_fraction(p, m, r)
  ms = lambda values: 1e3 * common.median(values) / args.steps
  return {'stages': p, 'microbatches': m, 'repeats': r, 'mesh': {'stage': p, 'data': DEVICES // p},
          'ms_pipelined': ms(wall['pipelined']), 'ms_no_bubble': ms(wall['no_bubble']),
          'cpu_ms_pipelined': ms(cpu['pipelined']), 'cpu_ms_no_bubble': ms(cpu['no_bubble']),
          'bubble_measured': measured,
          'bubble_measured_wall': _bubble(wall['no_bubble'], wall['pipelined']),
          'bubble_gpipe': formula, 'relative_error': abs(measured - formula) / formula,
          'within_20pct': abs(measured - formula) <= 0.2 * formula}


def slope_check(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """The bubble from the pipelined step times alone: at a fixed microbatch size a step costs
  c (m + p - 1) + o, so c = dT / dm between the two smallest m, o = T - c (m + p - 1), and
  1 - m c / T counts the bubble and the fixed per-step cost o together."""
  out = []
  for p in sorted({q['stages'] for q in points}):
    row = sorted((q for q in points if q['stages'] == p and q['repeats'] == 1),
                 key=lambda q: q['microbatches'])
    if len(row) < 2:
      continue
    a, b = row[0], row[1]
    c = (b['cpu_ms_pipelined'] - a['cpu_ms_pipelined']) / (b['microbatches'] - a['microbatches'])
    out += [{'stages': p, 'microbatches': q['microbatches'], 'cpu_ms_per_iteration': c,
             'cpu_ms_fixed': q['cpu_ms_pipelined'] - c * (q['microbatches'] + p - 1),
             'bubble_slope': 1 - q['microbatches'] * c / q['cpu_ms_pipelined']} for q in row]
  return out


def child(args: argparse.Namespace) -> None:
  import jax
  assert jax.device_count() == DEVICES, jax.devices()
  stages = [int(s) for s in args.stages.split(',')]
  counts = [int(m) for m in args.microbatches.split(',')]
  points = [point(args, p, m) for p in stages for m in counts]
  if args.circular > 1:  # Where the schedule fits: m >= p and r p | layers.
    points += [point(args, p, m, args.circular) for p in stages for m in counts
               if m >= p and args.layers % (args.circular * p) == 0]
  common.emit({'points': points, 'slope': slope_check(points),
               'platform': jax.devices()[0].platform})


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  if args.child:
    return child(args)
  forwarded = list(argv if argv is not None else sys.argv[1:])
  result = common.run_child(common.rerun(__spec__, '--child', *forwarded),
                            env=common.child_env(DEVICES))
  model = {'layers': args.layers, 'd': args.d, 'hidden': 4 * args.d, 'rows_per_microbatch':
           args.rows, 'tokens': args.tokens, 'step': 'value_and_grad, float32'}
  common.emit({'benchmark': 'pipeline', 'quick': args.quick, 'devices': DEVICES, 'model': model,
               'steps': args.steps, 'repeats': args.repeats,
               'method': 'bubble_measured = 1 - t(no_bubble) / t(pipelined) in process CPU time '
                         '(median of paired repeats); see the docstring',
               **result, 'all_within_20pct': all(q['within_20pct'] for q in result['points']),
               'machine': common.machine()})


if __name__ == '__main__':
  main()
