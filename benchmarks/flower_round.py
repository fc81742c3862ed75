"""A federated round on a local Flower federation against the same round in the simulation.

    python -m benchmarks.flower_round [--rounds 4] [--nodes 2] [--clients 5] [--cohort 3]

The task is federated.DigitsFedAvg with `--clients` clients, `--cohort` a round, 2 local steps
on batches of 8. Three ways to run its rounds, on the same cohorts (the simulation's):
- `simulation`: `python -m paxlike.main` (the sharded round in one program), seconds per round
  from its rows' `steps_per_sec` after the first (compiling) round;
- `executor`: the exported round's programs in one process (`paxlike.export.run`), no network:
  the compute a deployment cannot avoid;
- `flower`: `paxlike.deploy.flower.local`'s federation (SuperLink over TLS, `--nodes` SuperNodes,
  a ClientApp process per message), seconds per round from the ServerApp's `cohorts.jsonl`
  after the first, split into the server's programs, the nodes' client programs (their first
  call in a fresh process, so XLA's compile included), the nodes' ClientApp start and loading (a new process per message: Python, JAX, the program, the
  data), and the rest (Flower's messaging: the nodes' 3 s polls, serialization, transfer).
Bytes per round: the arrays in the round's messages (`cohorts.jsonl`: down and up) against the
plan's figure (cohort × (download + upload bytes per client)), and Flower's own count of the
run's traffic (`flwr ls`, all messages, queries included, divided by the rounds).
One JSON object on stdout; the machine is shared, so the figures are under its load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common


def _flags(clients: int, cohort: int) -> list[str]:
  return ['--exp=federated.DigitsFedAvg', f'--fdl_set=data.clients_per_round={cohort}',
          '--fdl_set=data.local_steps=2', '--fdl_set=data.batch_size=8',
          f'--fdl_set=data.num_clients={clients}']


def _python(args: list[str], timeout: float) -> str:
  import subprocess
  done = subprocess.run([sys.executable, *args], cwd=common.REPO, env=common.child_env(),
                        text=True, capture_output=True, timeout=timeout)
  if done.returncode != 0:
    raise SystemExit(f'{" ".join(args[:3])} failed: {done.stderr[-2000:]}')
  return done.stdout


def _rows(path: Path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines()]


def simulation_seconds(flags: list[str], rounds: int, job: Path) -> float:
  """Median seconds per round of paxlike.main after its first round."""
  _python(['-m', 'paxlike.main', *flags, f'--job_log_dir={job}',
           f'--fdl_set=train.num_steps={rounds}', '--fdl_set=train.log_every=1',
           '--fdl_set=train.eval_every=1000', '--fdl_set=train.checkpoint_every=1000'], 900)
  return statistics.median(1 / r['steps_per_sec'] for r in _rows(job / 'metrics.jsonl')[1:])


def executor_seconds(export: Path, rounds: int) -> float:
  """Median seconds per round of the exported programs in this process, after the first."""
  from paxlike.export import run as executor
  ex = executor.load(export)
  carried, times = dict(ex.carried), []
  for r in range(rounds):
    began = time.perf_counter()
    outputs = executor.run_round(ex, {**carried, **{n: a[r] for n, a in ex.rounds.items()}})
    times.append(time.perf_counter() - began)
    carried = {n: outputs[n] for n in carried}
  return statistics.median(times[1:])


def flower_split(out: Path, nodes: int) -> dict[str, float]:
  """Median seconds per round (after the first) of the deployment and its parts."""
  cohorts = _rows(out / 'server' / 'cohorts.jsonl')[1:]
  by_step: dict[int, list[dict]] = {}
  for k in range(nodes):
    for entry in _rows(out / 'logs' / f'node{k}.jsonl'):
      by_step.setdefault(entry['step'], []).append(entry)
  parts: dict[str, list[float]] = {'round': [], 'server_programs': [], 'client_programs': [],
                                   'clientapp_start_and_load': [], 'messaging': []}
  for row in cohorts:
    entries = by_step[row['step']]
    slowest = max(entries, key=lambda e: sum(e[k] for k in e if k.endswith('_seconds')))
    setup = slowest['start_seconds'] + slowest['load_seconds'] + slowest['data_seconds']
    parts['round'].append(row['round_seconds'])
    parts['server_programs'].append(row['server_seconds'])
    parts['client_programs'].append(slowest['compute_seconds'])
    parts['clientapp_start_and_load'].append(setup)
    parts['messaging'].append(row['round_seconds'] - row['server_seconds']
                              - slowest['compute_seconds'] - setup)
  return {name: statistics.median(values) for name, values in parts.items()}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=4)
  parser.add_argument('--nodes', type=int, default=2)
  parser.add_argument('--clients', type=int, default=5)
  parser.add_argument('--cohort', type=int, default=3)
  args = parser.parse_args()
  flags = _flags(args.clients, args.cohort)
  with tempfile.TemporaryDirectory() as tmp:
    root = Path(tmp)
    _python(['-m', 'paxlike.export', *flags, f'--out={root / "export"}',
             f'--rounds={args.rounds}'], 600)
    plan = json.loads((root / 'export' / 'plan.json').read_text())
    common.log('simulation ...')
    simulation = simulation_seconds(flags, args.rounds, root / 'job')
    common.log('executor ...')
    executor = executor_seconds(root / 'export', args.rounds)
    common.log('flower ...')
    _python(['-m', 'paxlike.deploy.flower.local', *flags, f'--export_dir={root / "export"}',
             f'--out={root / "flower"}', f'--rounds={args.rounds}', f'--nodes={args.nodes}',
             '--server_restarts=0'], 1800)
    split = flower_split(root / 'flower', args.nodes)
    sent = _rows(root / 'flower' / 'server' / 'cohorts.jsonl')
    traffic = json.loads((root / 'flower' / 'runs.json').read_text())['runs'][0]['network-traffic']
  plan_bytes = args.cohort * (plan['download_bytes_per_client'] + plan['upload_bytes_per_client'])
  message_bytes = statistics.median(r['bytes_down'] + r['bytes_up'] for r in sent)
  common.emit({
      'benchmark': 'flower_round', 'experiment': 'federated.DigitsFedAvg', 'rounds': args.rounds,
      'nodes': args.nodes, 'clients': args.clients, 'cohort': args.cohort, 'under_load': True,
      'seconds_per_round': {'simulation': simulation, 'executor': executor, 'flower': split},
      'flower_over_simulation': split['round'] / simulation,
      'flower_over_executor': split['round'] / executor,
      'bytes_per_round': {'plan': plan_bytes, 'messages': message_bytes,
                          'messages_over_plan': message_bytes / plan_bytes,
                          'flower_traffic': traffic['total-bytes'] / args.rounds}})


if __name__ == '__main__':
  main()
