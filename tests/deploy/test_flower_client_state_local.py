"""Client state on real SuperNodes (issue 72): a SCAFFOLD federation (3 clients, all every round,
their control variates kept by the nodes) started by the local launcher on 2 nodes, killed with
`kill -9` of the launcher's process group once round 1 is checkpointed (every node with it), and
resumed by the same command with --nodes=3: nodes 0 and 1 restart on their state-dirs and read
their clients' rows from disk; client 2 now lives on node 2, so node 0 seals its row for node 2
(`query.handoff`) and the server relays it unread. The rows equal the executor's uninterrupted
rounds, and each client's newest row on the nodes is the executor's final control variate."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.deploy import flower_procs as fp
from tests.helpers import REPO, cli_env, made_once, run_python

pytestmark = pytest.mark.slow  # An export and two launches of a small federation.

SCAFFOLD = ['--exp=federated.DigitsScaffold', '--fdl_set=data.batch_size=8',
            '--fdl_set=data.num_clients=3', '--fdl_set=data.clients_per_round=3',
            '--fdl_set=algorithm.num_clients=3', '--fdl_set=data.local_steps=2']
ROUNDS = 2


def _export(tmp_path_factory) -> Path:
  def make(out: Path) -> None:
    made = run_python(['-m', 'paxlike.export', *SCAFFOLD, f'--out={out}', f'--rounds={ROUNDS}'],
                      cli_env(), timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
  return made_once(tmp_path_factory, 'flower_scaffold_export', make)


def _command(export: Path, out: Path, nodes: int) -> list[str]:
  return [sys.executable, '-m', 'paxlike.deploy.flower.local', *SCAFFOLD,
          f'--export_dir={export}', f'--out={out}', f'--rounds={ROUNDS}', f'--nodes={nodes}',
          '--round_timeout=90']


def _held(out: Path, node: str) -> list[tuple[int, int]]:
  from paxlike.deploy.flower import client_state
  return client_state.Store(out / 'nodes' / node).held()


def test_nodes_killed_with_their_launcher_restore_their_clients_state_and_hand_it_over(
    tmp_path_factory, tmp_path):
  from paxlike.config import config_io
  from paxlike.deploy.flower import rounds
  from paxlike.export import run as executor
  from tests.deploy.reference import assert_rows_equal, executor_rounds
  export, out = _export(tmp_path_factory), tmp_path / 'run'
  began = fp.now_ticks()
  first = fp.start_group(_command(export, out, 2), tmp_path / 'first.log')
  try:
    fp.wait_until(lambda: (out / 'server' / 'checkpoints' / '1').is_dir(), 400,
                  'round 1\'s checkpoint', first)
    running = len(fp.flower_processes_since(began))
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    fp.wait_until(lambda: not fp.flower_processes_since(began), 20,
                  'the Flower processes to be gone')
  finally:
    fp.stop_group(first)
  assert running >= 5  # The SuperLink, two nodes, flwr run, the warm server (and the apps).
  # Node 0 holds clients 0 and 2, node 1 client 1: each kept its clients' rows of round 1.
  assert {s for s, v in _held(out, 'node0') if v == 1} == {0, 2}
  assert {s for s, v in _held(out, 'node1') if v == 1} == {1}

  began = fp.now_ticks()
  second = subprocess.run(_command(export, out, 3), cwd=REPO, env=cli_env(), text=True,
                          capture_output=True, timeout=600)
  assert second.returncode == 0, second.stderr[-3000:]
  assert 'resuming' in second.stderr and 'after round 1' in second.stderr
  assert fp.flower_processes_since(began) == []
  cohorts = fp.rows(out / 'server' / 'cohorts.jsonl')
  rows = fp.rows(out / 'server' / 'metrics.jsonl')
  assert [r['step'] for r in rows] == [c['step'] for c in cohorts] == [1, 2]
  assert [c['cohort'] for c in cohorts] == [[0, 1, 2]] * 2
  assert all(c['dropped_slots'] == [] and c['state_reset_slots'] == [] for c in cohorts)
  assert cohorts[0]['state_handoff_bytes'] == 0 < cohorts[1]['state_handoff_bytes']
  ran = [(e['step'], e['slots']) for e in fp.rows(out / 'logs' / 'node2.jsonl')]
  assert ran == [(2, [2])]  # Client 2's round 2 ran on node 2, from node 0's sealed row.
  task = config_io.build(config_io.load_file(out / 'config.json'))
  expected = executor_rounds(task, export, cohorts)
  assert_rows_equal(rows, expected)
  names = rounds.client_state(executor.load(export).plan)
  assert names and {s for s, v in _held(out, 'node2') if v == 2} == {2}
  from paxlike.deploy.flower import client_state
  for slot in range(3):  # Client k's row after round 2, on node k (node k ran it).
    row = client_state.Store(out / 'nodes' / f'node{slot}').row(slot, 2)
    for name in names:
      np.testing.assert_allclose(row[name], expected[-1][name][slot], rtol=1e-5, atol=1e-6,
                                 err_msg=f'{name}[{slot}]')
