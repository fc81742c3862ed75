"""Weak scaling of a federated round: cohort and devices grow together; FAX's claim is a flat line.

    python -m benchmarks.weak_scaling [--devices 1,2,4,8] [--clients-per-device 4] [--png PATH]
    python -m benchmarks.weak_scaling --quick      # 1 and 2 devices, a tiny round (tests)

For each device count n, a child process runs `--exp` (default federated.ShakespeareFedAvg, the
tiny LM) with cohort n × `--clients-per-device` on a ('clients', 'data') = (n, 1) mesh, and times
`build.setup(task).step` fed as the trainer feeds it (benchmarks/accelerator_mfu.py's trainer loop).
Devices: n forced CPU devices on a CPU host; on a GPU host the first n GPUs
(CUDA_VISIBLE_DEVICES), up to the number present. Prints one JSON object: per point the round
time and `efficiency` = round time at 1 device / round time at n (1.0 is perfectly flat), and
writes a PNG of round time against devices. On a CPU host every forced device shares the same
cores, so the line rises with n: that measures the framework's overhead, not the hardware's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks import common

QUICK_MODEL = ['model.num_layers=1', 'model.d_model=32', 'model.num_heads=2', 'model.d_ff=64']


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = common.parser(__doc__, '1 and 2 devices, a tiny round')
  parser.add_argument('--exp', default='federated.ShakespeareFedAvg')
  parser.add_argument('--set', action='append', default=[], metavar='PATH=VALUE')
  parser.add_argument('--devices', default='1,2,4,8', help='device counts (up to those present)')
  parser.add_argument('--clients-per-device', type=int, default=4)
  parser.add_argument('--local-steps', type=int, default=4)
  parser.add_argument('--steps', type=int, default=5, help='timed rounds per point')
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--png', type=Path, default=Path('/tmp/paxlike/weak_scaling.png'))
  parser.add_argument('--child', type=int, help=argparse.SUPPRESS)  # Internal: one point.
  args = parser.parse_args(argv)
  if args.quick:
    args.devices, args.clients_per_device, args.local_steps = '1,2', 2, 1
    args.steps, args.warmup, args.set = 2, 1, [*QUICK_MODEL, *args.set]
  return args


def point(args: argparse.Namespace, devices: int) -> dict[str, Any]:
  """One device count's round time (run in a child that sees exactly `devices` devices)."""
  import jax
  from benchmarks import accelerator_mfu
  from paxlike.trainer import build
  cohort = devices * args.clients_per_device
  task = accelerator_mfu.task_of(args.exp, [], [
      f'data.clients_per_round={cohort}', f'data.local_steps={args.local_steps}',
      f'mesh.ici=({devices}, 1)', "mesh.axes=('clients', 'data')", *args.set])
  s = build.setup(task, evaluator=False)  # Nothing here evaluates.
  assert s.program.mesh.size == devices == len(jax.devices())
  round_s = accelerator_mfu.trainer_seconds_per_step(s, args.warmup, args.steps)
  return {'devices': devices, 'cohort': cohort, 'round_s': round_s,
          'mesh': dict(s.program.mesh.shape), 'platform': jax.devices()[0].platform}


def accelerators() -> tuple[str, int]:
  """('gpu', count) on a GPU host, else ('cpu', 0): asked in a child so this process stays
  free of JAX (each child picks its own devices)."""
  probe = ('import json, jax; d = jax.devices(); '
           'print(json.dumps({"platform": d[0].platform, "count": len(d)}))')
  try:
    found = common.run_child(['-c', probe], env=common.child_env(1), timeout=300)
  except RuntimeError:
    return 'cpu', 0
  return (found['platform'], found['count']) if found['platform'] == 'gpu' else ('cpu', 0)


def child_env(platform: str, devices: int) -> dict[str, str]:
  if platform == 'gpu':
    return {**common.child_env(1), 'CUDA_VISIBLE_DEVICES': ','.join(map(str, range(devices)))}
  return common.child_env(devices, JAX_PLATFORMS='cpu')


def plot(points: list[dict[str, Any]], path: Path, title: str) -> None:
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  devices = [p['devices'] for p in points]
  fig, ax = plt.subplots(figsize=(5, 3.5))
  ax.plot(devices, [1e3 * p['round_s'] for p in points], 'o-', label='round time')
  ax.axhline(1e3 * points[0]['round_s'], color='gray', linestyle='--', label='flat (ideal)')
  ax.set(xscale='log', xticks=devices, xticklabels=[str(d) for d in devices], ylim=(0, None),
         xlabel='devices (cohort grows with them)', ylabel='ms per round', title=title)
  ax.legend()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


def main(argv: list[str] | None = None) -> int:
  args = parse_args(argv)
  if args.child:
    common.emit(point(args, args.child))
    return 0
  platform, present = accelerators()
  wanted = [int(n) for n in args.devices.split(',')]
  counts = [n for n in wanted if platform == 'cpu' or n <= present]
  forwarded = [f'--{k}={v}' for k, v in (('exp', args.exp), ('local-steps', args.local_steps),
                                          ('clients-per-device', args.clients_per_device),
                                          ('steps', args.steps), ('warmup', args.warmup))]
  forwarded += [f'--set={s}' for s in args.set]
  points = []
  for n in counts:
    common.log(f'weak_scaling: {n} {platform} device(s), cohort {n * args.clients_per_device}')
    points.append(common.run_child(common.rerun(__spec__, f'--child={n}', *forwarded),
                                   env=child_env(platform, n)))
  for p in points:
    p['efficiency'] = points[0]['round_s'] / p['round_s']
  title = f'{args.exp.split(".")[-1]}: {args.clients_per_device} clients per {platform} device'
  plot(points, args.png, title)
  common.emit({'benchmark': 'weak_scaling', 'platform': platform, 'exp': args.exp,
               'clients_per_device': args.clients_per_device, 'local_steps': args.local_steps,
               'points': points, 'min_efficiency': min(p['efficiency'] for p in points),
               'png': str(args.png), 'skipped_devices': [n for n in wanted if n not in counts],
               **common.machine()})
  return 0


if __name__ == '__main__':
  sys.exit(main())
