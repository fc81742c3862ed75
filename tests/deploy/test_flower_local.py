"""A DigitsFedAvg export run by a local Flower federation (a SuperLink and two SuperNodes as
separate processes) gives the reference executor's rows and final state, each node running
only the clients it holds, and every process it started is gone afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from paxlike.export import run as executor
from tests.helpers import REPO, cli_env

pytestmark = pytest.mark.slow  # Three Flower processes and a ClientApp process per message.

CLI_TINY = ['--exp=federated.DigitsFedAvg', '--fdl_set=data.clients_per_round=3',
            '--fdl_set=data.local_steps=2', '--fdl_set=data.batch_size=8',
            '--fdl_set=data.num_clients=5']
ROUNDS, NODES = 2, 2


def _python(module: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-m', module, *args], cwd=REPO, env=cli_env(),
                        text=True, capture_output=True, timeout=timeout)


@pytest.fixture(scope='module')
def federation(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
  """(the export dir, the Flower run's dir) of one 2-round run."""
  root = tmp_path_factory.mktemp('flower')
  export, out = root / 'export', root / 'run'
  made = _python('paxlike.export', *CLI_TINY, f'--out={export}', f'--rounds={ROUNDS}',
                 timeout=300)
  assert made.returncode == 0, made.stderr[-2000:]
  ran = _python('paxlike.deploy.flower.local', *CLI_TINY, f'--export_dir={export}',
                f'--out={out}', f'--rounds={ROUNDS}', f'--nodes={NODES}',
                '--round_timeout=120', timeout=600)
  assert ran.returncode == 0, ran.stderr[-3000:]
  return export, out


def test_rows_and_final_state_equal_the_reference_executor(federation):
  export, out = federation
  history = executor.run_rounds(executor.load(export), ROUNDS)
  rows = [json.loads(line) for line in (out / 'server' / 'metrics.jsonl').read_text().splitlines()]
  assert [row['round'] for row in rows] == list(range(1, ROUNDS + 1))
  for row, outputs in zip(rows, history):
    scalars = {n: v.item() for n, v in outputs.items() if v.size == 1}
    assert set(scalars) <= set(row)
    for name, value in scalars.items():
      np.testing.assert_allclose(row[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
  start = executor.load(export).carried
  with np.load(out / 'server' / 'final.npz') as final:
    assert sorted(final.files) == sorted(start)
    for name in start:
      np.testing.assert_allclose(final[name], history[-1][name], rtol=1e-5, atol=1e-6,
                                 err_msg=name)
    params = [n for n in start if n.startswith('state.params.')]
    assert params and all(not np.allclose(final[n], start[n]) for n in params)  # It trained.


def test_each_node_ran_only_its_own_clients_and_every_cohort_slot_once(federation):
  _, out = federation
  rows = [json.loads(line) for line in (out / 'server' / 'metrics.jsonl').read_text().splitlines()]
  ran: dict[int, dict[int, int]] = {}  # step -> {slot: client}
  for k in range(NODES):
    for line in (out / 'logs' / f'node{k}.jsonl').read_text().splitlines():
      entry = json.loads(line)
      assert all(c % NODES == k for c in entry['clients']), (k, entry)
      for slot, client in zip(entry['slots'], entry['clients']):
        assert slot not in ran.setdefault(entry['step'], {})
        ran[entry['step']][slot] = client
  for row in rows:
    slots = ran[row['step']]
    assert [slots[s] for s in sorted(slots)] == row['cohort']
    assert len(row['cohort']) == 3


def test_no_flower_process_outlives_the_run(federation):
  _, out = federation
  logs = str(out)
  alive = []
  for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
      cmdline = Path(f'/proc/{pid}/cmdline').read_bytes().replace(b'\0', b' ').decode()
    except OSError:
      continue
    if logs in cmdline:
      alive.append(cmdline)
  assert alive == []
