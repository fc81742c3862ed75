"""Cohorts on a deployment (the apps over tests/deploy/local_grid.py's stand-in Grid): after a
node is lost the next cohort is re-drawn among the clients still connected, and each round
equals the reference executor on the cohort its row records; with no loss, and with Poisson
cohorts (their padded slots run as the simulation's do), rounds equal `paxlike.main`'s; through
SecAgg+, a node lost mid-round makes the round run again among the others."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flwr.supercore.task_identity import TaskIdentity

from paxlike.config import config_io
from paxlike.data import sources
from paxlike.deploy.flower import progress, rounds
from paxlike.export import run as executor
from paxlike.export.__main__ import export_experiment
from tests.deploy.local_grid import FIRST_NODE, deploy
from tests.deploy.reference import (assert_rows_equal, assert_rows_within_secagg_bound,
                                    executor_rounds)
from tests.export.export_task import digits, train_to
from tests.helpers import TIMING_FIELDS

pytestmark = pytest.mark.slow  # An export and a deployed run (and a trainer run), seconds each.

NODES = 2


@pytest.fixture(autouse=True)
def _flower_task_identity(monkeypatch):
  monkeypatch.setattr(TaskIdentity, '_run_id', 1)  # Flower's Message needs a run and a node.
  monkeypatch.setattr(TaskIdentity, '_node_id', 0)
  monkeypatch.setattr(TaskIdentity, '_task_id', 1)


def _lines(path: Path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_after_a_node_is_lost_the_cohort_is_redrawn_among_the_live_clients(tmp_path):
  cfg, rounds = digits(), 3  # 20 clients, 3 a round; node k holds k, k + 2, ...
  export_experiment(cfg, tmp_path / 'export', rounds=rounds, experiment='fedavg')
  task = config_io.build(cfg)
  seed, sizes = task.train.seed, task.data.client_sizes
  simulated = [sources.sample_cohort(seed, s, sizes, 3, 'uniform') for s in (1, 2, 3)]
  # Node 1 dies during round 2, which has its clients; round 3's simulated cohort has one too.
  assert not any(c % NODES for c in simulated[0]) and any(c % NODES for c in simulated[1])
  assert any(c % NODES for c in simulated[2])
  run = tmp_path / 'run'
  deploy(cfg, tmp_path / 'export', run, rounds, NODES, lose_at={FIRST_NODE + 1: 2})

  cohorts = _lines(run / 'server' / 'cohorts.jsonl')
  rows = _lines(run / 'server' / 'metrics.jsonl')
  assert [c['cohort'] for c in cohorts[:2]] == [s.tolist() for s in simulated[:2]]
  assert cohorts[1]['dropped_slots'] == [s for s, c in enumerate(simulated[1]) if c % NODES]
  evens = list(range(0, 20, 2))
  assert cohorts[1]['live_clients'] == list(range(20)) and cohorts[2]['live_clients'] == evens
  redrawn = cohorts[2]['cohort']
  assert redrawn != simulated[2].tolist() and len(set(redrawn)) == 3
  assert set(redrawn) <= set(evens) and cohorts[2]['dropped_slots'] == []
  assert [r['nodes'] for r in rows] == [2, 1, 1]
  assert [r['clients_lost'] for r in rows] == [0, 10, 10]
  assert [r['dropped_slots'] for r in rows] == [0, 2, 0]
  node1 = _lines(run / 'node1.jsonl')
  assert [e['step'] for e in node1] == []  # Round 1 had none of its clients; then it died.
  node0 = {e['step']: e['clients'] for e in _lines(run / 'node0.jsonl')}
  assert node0[3] == redrawn  # The node drew the batches of the clients it was sent.
  assert_rows_equal(rows, executor_rounds(task, tmp_path / 'export', cohorts))


def test_poisson_cohorts_with_their_padded_slots_equal_the_simulation(tmp_path):
  cfg, rounds = digits(), 2
  config_io.apply_overrides(cfg, ['data.sampling=poisson', f'train.num_steps={rounds}'])
  simulated, state = train_to(cfg, tmp_path / 'job', rounds)
  export_experiment(cfg, tmp_path / 'export', rounds=rounds, experiment='poisson')
  run = tmp_path / 'run'
  deploy(cfg, tmp_path / 'export', run, rounds, NODES)

  cohorts = _lines(run / 'server' / 'cohorts.jsonl')
  task = config_io.build(cfg)
  for row in cohorts:  # The simulation's cohorts, padding included, every slot run.
    expected = sources.sample_cohort(task.train.seed, row['step'], task.data.client_sizes, 3,
                                     'poisson')
    assert row['cohort'] == expected.tolist() and row['dropped_slots'] == []
  assert sources.PADDED in cohorts[0]['cohort']  # The check covers padded slots.
  ran = [e for k in range(NODES) for e in _lines(run / f'node{k}.jsonl')]
  assert sorted((e['step'], s) for e in ran for s in e['slots']) == sorted(
      (c['step'], s) for c in cohorts for s in range(len(c['cohort'])))
  deployed = _lines(run / 'server' / 'metrics.jsonl')
  assert [r['step'] for r in deployed] == [r['step'] for r in simulated] == [1, 2]
  for sim, dep in zip(simulated, deployed):
    shared = set(sim) & set(dep) - TIMING_FIELDS - {'step'}
    assert {'loss', 'accuracy', 'clients'} <= shared, sorted(shared)
    for key in shared:
      np.testing.assert_allclose(dep[key], sim[key], rtol=1e-5, atol=1e-6, err_msg=key)
  with np.load(run / 'server' / 'final.npz') as final:
    assert sorted(final.files) == sorted(state)
    for name in final.files:
      np.testing.assert_allclose(final[name], state[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_secure_poisson_rounds_outlive_a_node_lost_mid_round(tmp_path):
  """Poisson cohorts through SecAgg+ on 4 nodes, node 1 lost during round 2: SecAgg+ halts
  (every node's masks must come off), the round runs again among nodes 0, 2 and 3 with node 1's
  slots dropped (weight 0: the plain path's dropped straggler), round 3 is drawn among the
  clients still connected, and every round equals the reference executor on the cohort its
  row records, within the quantization's bound."""
  cfg, rounds_, nodes = digits(), 3, 4  # SecAgg+ needs 3 nodes after the loss.
  config_io.apply_overrides(cfg, ['data.sampling=poisson', f'train.num_steps={rounds_}',
                                 'train.seed=67'])  # Node 1 serves rounds 1-3.
  export_experiment(cfg, tmp_path / 'export', rounds=rounds_, experiment='poisson')
  task = config_io.build(cfg)
  seed, sizes = task.train.seed, task.data.client_sizes
  simulated = [sources.sample_cohort(seed, s, sizes, 3, 'poisson').tolist() for s in (1, 2, 3)]
  owner = {c: FIRST_NODE + c % nodes for c in range(20)}
  lost = FIRST_NODE + 1
  on_lost = [rounds.slots_by_node(np.array(c), owner, True)[0].get(lost, []) for c in simulated]
  assert on_lost[1] and any(c % nodes == 1 for c in simulated[2])  # The loss shows in both.
  run = tmp_path / 'run'
  deploy(cfg, tmp_path / 'export', run, rounds_, nodes, lose_at={lost: 2}, secure=True)

  cohorts = _lines(run / 'server' / 'cohorts.jsonl')
  rows = _lines(run / 'server' / 'metrics.jsonl')
  assert [c['cohort'] for c in cohorts[:2]] == simulated[:2]
  assert sources.PADDED in sum((c['cohort'] for c in cohorts), [])  # Padded slots ran too.
  assert [c['secagg_attempts'] for c in cohorts] == [1, 2, 1]
  assert [c['dropped_slots'] for c in cohorts[:2]] == [[], on_lost[1]]
  live = [c for c in range(20) if c % nodes != 1]
  assert cohorts[2]['live_clients'] == live and cohorts[2]['dropped_slots'] == []
  assert set(cohorts[2]['cohort']) - {sources.PADDED} <= set(live)
  assert [r['nodes'] for r in rows] == [4, 3, 3]
  assert [r['clients_lost'] for r in rows] == [0, 20 - len(live), 20 - len(live)]
  assert [e['step'] for e in _lines(run / 'node1.jsonl')] == [1]  # Round 2's run was lost.
  # The last round from the state the deployment had after round 2 (its checkpoint): one
  # round's quantization alone. The state three rounds on has no such bound, because a
  # perturbed parameter can cross a ReLU's kink and change the next round's gradients.
  expected = executor_rounds(task, tmp_path / 'export', cohorts[:2])
  (last,) = executor_rounds(task, tmp_path / 'export', cohorts[2:],
                            state=_deployed_state(run / 'server', tmp_path / 'export', step=2))
  relative = assert_rows_within_secagg_bound(task, rows, cohorts, [*expected, last])
  with np.load(run / 'server' / 'final.npz') as final:
    for name in final.files:
      want = last[name].astype(np.float64)
      allowed = 2 * relative * (1 + np.abs(want)) + 1e-6 * np.abs(want)
      assert np.all(np.abs(final[name] - want) <= allowed), name


def _deployed_state(server: Path, export: Path, step: int) -> dict[str, np.ndarray]:
  """The server state a deployed run checkpointed after round `step`."""
  checkpoints = progress.open_checkpoints(server)
  try:
    resumed = progress.resume(checkpoints, 0, executor.load(export).carried, step)
  finally:
    checkpoints.close()
  assert resumed.step == step
  return resumed.state
