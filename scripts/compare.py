"""Run experiments with equal total client steps and write a comparison report.

    python scripts/compare.py --out DIR [--experiments a,b,c] [--rounds 50] [--set PATH=VALUE]

Each experiment trains through the real CLI (`python -m paxlike.main`) into `DIR/runs/NAME`.
Budget: an experiment's round costs `clients_per_round × local_steps` client steps (read from
its built task: `task.data`, the one place the cohort shape is set);
the costliest one runs `--rounds` rounds, and every other one gets
`train.num_steps = round(budget / its client steps per round)` (`--budget tokens` weighs each
client step by its batch's tokens or examples instead). Writes `DIR/report.md` (final eval
loss, wall time, bytes communicated, rounds), `DIR/loss_vs_round.png` and
`DIR/loss_vs_communication.png`. Rerunning with the same arguments reuses finished runs.

Bytes communicated per round, with P the bytes of the model parameters and C the cohort:
- FedAvg / FedOpt / DiLoCo (server model down, client model up): 2·P·C;
- PAPA (members exchange with the mean every `every` rounds): 2·P·C / every;
- BTM (branch once, merge once over the whole run): 2·P·C / rounds;
- centralized: 0 (one job in one place; its data-parallel all-reduce is not counted).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cli_runs  # noqa: E402
import plot_metrics  # noqa: E402

REPO = cli_runs.REPO
DEFAULT_EXPERIMENTS = ('federated.ShakespeareFedAvg', 'federated.ShakespeareFedAdam',
                       'federated.ShakespeareDiLoCo', 'federated.ShakespearePapa',
                       'federated.ShakespeareBtm', 'federated.ShakespeareCentralized')


@dataclasses.dataclass
class Plan:
  """One experiment's place in the comparison."""

  name: str
  algorithm: str
  clients: int
  local_steps: int
  items_per_client_step: int
  param_bytes: int
  every: int = 1  # PAPA's averaging period in rounds.
  rounds: int = 0

  def cost_per_round(self, budget: str) -> int:
    steps = self.clients * self.local_steps
    return steps * self.items_per_client_step if budget == 'tokens' else steps

  def bytes_per_round(self) -> float:
    """See the module docstring."""
    if self.algorithm == 'centralized':
      return 0.0
    full = 2.0 * self.param_bytes * self.clients
    if self.algorithm == 'papa':
      return full / self.every
    if self.algorithm == 'btm':
      return full / self.rounds
    return full


def plan(name: str, overrides: list[str]) -> Plan:
  """Reads an experiment's cohort, algorithm and parameter bytes from its built task."""
  import flax.linen as nn
  import jax
  from paxlike import registry
  from paxlike.config import config_io
  registry.import_all()
  cfg = registry.get(name)().config()
  config_io.apply_overrides(cfg, overrides)
  task = config_io.build(cfg)
  algorithm = getattr(task.algorithm, 'func', task.algorithm).__name__
  task.data.prepare()
  inputs = task.data.batch_spec().eval['inputs']
  sample = jax.ShapeDtypeStruct((1, *inputs.shape[1:]), inputs.dtype)
  params = nn.unbox(jax.eval_shape(task.model.init, jax.random.key(0), sample))['params']
  param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  data = task.data
  row = data.batch_spec().round['mask'].shape[3:]  # A row's tokens ([seq_len]) or one example.
  items = data.batch_size * math.prod(row)
  every = getattr(task.algorithm, 'keywords', {}).get('every', 1)
  return Plan(name, algorithm, data.clients_per_round, data.local_steps, items, param_bytes,
              every)


def run(p: Plan, out: Path, overrides: list[str], evals: int, timeout: float) -> dict[str, Any]:
  """Trains `p` through the CLI (or reuses an identical finished run); returns its record."""
  job = out / 'runs' / p.name
  every = max(1, p.rounds // evals)
  command = [sys.executable, '-m', 'paxlike.main', f'--exp={p.name}', f'--job_log_dir={job}',
             f'--fdl_set=train.num_steps={p.rounds}', f'--fdl_set=train.eval_every={every}',
             f'--fdl_set=train.log_every={every}', f'--fdl_set=train.checkpoint_every={p.rounds}',
             *(f'--fdl_set={o}' for o in overrides)]
  record_path = job / 'compare.json'
  if record_path.is_file():
    record = json.loads(record_path.read_text())
    if record['command'][1:] == command[1:] and record['returncode'] == 0:
      print(f'compare: {p.name}: reusing {job}', file=sys.stderr)
      return record
  if (job / 'metrics.jsonl').exists():
    raise SystemExit(f'compare: error: {job} holds another run; choose another --out')
  job.parent.mkdir(parents=True, exist_ok=True)
  print(f'compare: {p.name}: {p.rounds} rounds ({p.algorithm}, {p.clients} clients × '
        f'{p.local_steps} local steps)', file=sys.stderr, flush=True)
  log_path = out / 'runs' / f'{p.name}.log'
  start = time.perf_counter()
  with log_path.open('w') as log, cli_runs.started(command, log, subprocess.STDOUT) as proc:
    code = proc.wait(timeout)
  record = {'command': command, 'returncode': code, 'wall_time_s': time.perf_counter() - start}
  if code == 0:
    record_path.write_text(json.dumps(record))
  else:
    tail = log_path.read_text().strip().splitlines()[-1:] or ['']
    record['error'] = tail[0]
    print(f'compare: {p.name} failed (exit {code}): {tail[0]}', file=sys.stderr)
  return record


def write_report(out: Path, plans: list[Plan], records: dict[str, dict], budget: str,
                 total: int, argv: list[str]) -> None:
  """report.md plus the two plots."""
  curves, comm_curves, hlines = [], [], []
  rows = ['| experiment | algorithm | rounds | clients/round | local steps | client steps '
          '| final eval loss | wall time (s) | MB/round | total MB |',
          '|---|---|---|---|---|---|---|---|---|---|']
  for p in plans:
    record = records[p.name]
    metrics = out / 'runs' / p.name / 'metrics.jsonl'
    xs, ys = plot_metrics.series(plot_metrics.read_rows(metrics), 'eval_loss') if (
        metrics.is_file()) else ([], [])
    final = f'{ys[-1]:.4f}' if ys and record['returncode'] == 0 else (
        f"failed: {record.get('error', '')}")
    mb = p.bytes_per_round() / 1e6
    rows.append(f'| {p.name} | {p.algorithm} | {p.rounds} | {p.clients} | {p.local_steps} '
                f'| {p.rounds * p.clients * p.local_steps} | {final} '
                f"| {record['wall_time_s']:.1f} | {mb:.3g} | {mb * p.rounds:.4g} |")
    if ys:
      curves.append((p.name, xs, ys))
      if mb > 0:
        comm_curves.append((p.name, [x * mb for x in xs], ys))
      else:
        hlines.append((f'{p.name} (no communication), final', ys[-1]))
  rounds = [p.rounds for p in plans]
  plot_metrics.plot(curves, out / 'loss_vs_round.png', 'round (step)', 'eval_loss',
                    'held-out loss vs round', logx=max(rounds) > 20 * min(rounds))
  plot_metrics.plot(comm_curves, out / 'loss_vs_communication.png',
                    'MB communicated (cumulative)', 'eval_loss',
                    'held-out loss vs communication', hlines=hlines)
  unit = 'client steps' if budget == 'client_steps' else 'tokens (or examples) in client steps'
  text = [
      '# Comparison report', '',
      f'`python scripts/compare.py {" ".join(argv)}`', '',
      f'Equal budget: {total} {unit} per experiment (rounds × clients/round × local steps'
      f'{"" if budget == "client_steps" else " × batch items"}); the costliest round gets '
      'the given rounds, the others proportionally more. Wall time is the whole CLI process '
      '(start-up, compilation, evals). Final eval loss is the last `eval_loss` in metrics.jsonl.',
      '', *rows, '',
      'Bytes communicated per round, P = parameter bytes, C = clients per round: FedAvg, FedOpt '
      'and DiLoCo 2·P·C (model down, model up); PAPA 2·P·C / every (it averages every `every` '
      'rounds); BTM 2·P·C / rounds (branch once, merge once); centralized 0.', '',
      '![loss vs round](loss_vs_round.png)', '',
      '![loss vs communication](loss_vs_communication.png)', '']
  (out / 'report.md').write_text('\n'.join(text))


def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', type=Path, required=True)
  parser.add_argument('--experiments', default=','.join(DEFAULT_EXPERIMENTS))
  parser.add_argument('--rounds', type=int, default=50,
                      help='rounds of the experiment with the costliest round')
  parser.add_argument('--budget', choices=('client_steps', 'tokens'), default='client_steps')
  parser.add_argument('--evals', type=int, default=10, help='eval points per run')
  parser.add_argument('--set', action='append', default=[], metavar='PATH=VALUE',
                      help='--fdl_set override for every experiment (repeatable)')
  parser.add_argument('--timeout', type=float, default=3600, help='seconds per run')
  args = parser.parse_args(argv)
  from paxlike.errors import UserError
  try:
    plans = [plan(name.strip(), args.set) for name in args.experiments.split(',') if name.strip()]
  except UserError as error:
    print(f'compare: error: {error}', file=sys.stderr)
    return 2
  total = args.rounds * max(p.cost_per_round(args.budget) for p in plans)
  for p in plans:
    p.rounds = max(1, round(total / p.cost_per_round(args.budget)))
  args.out.mkdir(parents=True, exist_ok=True)
  records = {p.name: run(p, args.out, args.set, args.evals, args.timeout) for p in plans}
  write_report(args.out, plans, records, args.budget, total, argv)
  print(args.out / 'report.md')
  return 0 if all(r['returncode'] == 0 for r in records.values()) else 1


if __name__ == '__main__':
  sys.exit(main())
