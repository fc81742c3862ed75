"""Client state on the nodes (issue 72): a DiLoCo federation (3 replicas, cohorts drawn among 20
clients on 2 nodes, so replicas move between nodes) stopped after round 1 and started again
with fresh nodes and a new ServerApp: the server resumes from its checkpoint, which holds no
client state, the nodes read theirs from disk (the moved replicas handed over sealed by the
node that holds them), and both rounds equal `paxlike.main`'s. Over the stand-in Grid
(tests/deploy/local_grid.py), seconds."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.supercore.task_identity import TaskIdentity

from paxlike.deploy.flower import client_state, rounds
from tests.deploy.local_grid import deploy
from tests.deploy.test_flower_algorithms import assert_client_state
from tests.export.export_task import trained_and_exported
from tests.helpers import TIMING_FIELDS

pytestmark = pytest.mark.slow


def _lines(path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_restarted_federation_restores_the_client_state_from_the_nodes(
    tmp_path, tmp_path_factory, monkeypatch):
  monkeypatch.setattr(TaskIdentity, '_run_id', 1)
  monkeypatch.setattr(TaskIdentity, '_node_id', 0)
  monkeypatch.setattr(TaskIdentity, '_task_id', 1)
  trained = trained_and_exported(tmp_path_factory, 'diloco')
  plan = json.loads((trained.export / 'plan.json').read_text())
  names = rounds.client_state(plan)
  run = tmp_path / 'run'
  first = deploy(trained.cfg, trained.export, run, 1, 2)
  stored = {k: client_state.Store(run / f'node{k}').held() for k in range(2)}
  assert sorted(sum(stored.values(), [])) == [(0, 1), (1, 1), (2, 1)]  # On disk, round 1.
  second = deploy(trained.cfg, trained.export, run, 2, 2, again=True)  # Fresh contexts.
  assert second.sent[:2] == ['query', 'query'] and 'query.handoff' in second.sent
  assert {step for step, _, _ in second.down} == {2}  # Resumed after round 1.
  assert [r['step'] for r in _lines(run / 'server' / 'cohorts.jsonl')] == [1, 2]
  round2 = _lines(run / 'server' / 'cohorts.jsonl')[1]
  assert round2['state_handoff_bytes'] > 0 and round2['state_reset_slots'] == []
  for grid in (first, second):  # No message from the server carried a client's state.
    assert not [k for _, _, keys in grid.down for k in keys if k.split('/', 1)[1] in names]
  deployed = _lines(run / 'server' / 'metrics.jsonl')
  assert [r['step'] for r in deployed] == [r['step'] for r in trained.rows] == [1, 2]
  for sim, dep in zip(trained.rows, deployed):
    for key in set(sim) & set(dep) - TIMING_FIELDS - {'step'}:
      np.testing.assert_allclose(dep[key], sim[key], rtol=1e-5, atol=1e-6, err_msg=key)
  with np.load(run / 'server' / 'final.npz') as final:
    assert not set(final.files) & set(names)
  assert_client_state(run, 2, names, trained.state)
