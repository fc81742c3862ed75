"""The Flower apps' rounds equal `paxlike.main`'s for FedAdam, DiLoCo and SCAFFOLD (their state
carried per client slot), DP-FedAvg (with its dp_epsilon) and federated LoRA on text: the
ServerApp's `main` and the ClientApp's handlers run in this process over a stand-in for Flower's
Grid (tests/deploy/local_grid.py: two nodes, each with its own node config and clients), so
every record the apps exchange is built, read and reduced as on a real federation, in seconds.
The transport itself (SuperLink, SuperNodes, TLS, kills) is test_flower_local's; this file
checks what differs per algorithm: the plan's messages, the server programs, DP's noise from
the round key and its accounting, LoRA's adapters and its base (sent once: a node's second
message carries none of it)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.supercore.task_identity import TaskIdentity

from paxlike.deploy.flower import client_state, rounds
from tests.deploy.local_grid import deploy
from tests.export.export_task import ALGORITHMS, ROUNDS, trained_and_exported
from tests.helpers import TIMING_FIELDS

# A deployed run, and a trainer run and an export (tests/export/export_task.py's, made once per
# pytest run), seconds each.
pytestmark = pytest.mark.slow

NODES = 2


def _assert_downlink(plan: dict, grid, cohorts: list[dict]) -> None:
  """Each round's bytes_down is what its messages carried; a node's first message carries every
  value the plan sends once (the plan's download_once_bytes, plus each array's header), its
  later ones none; each other broadcast travels once per message, not once per slot."""
  once = sorted(e['value'] for e in plan['communication'] if e.get('once'))
  shared = sorted(e['value'] for e in plan['communication']
                  if e['kind'] == 'broadcast' and not e.get('once'))
  seen = set()
  for row in cohorts:
    messages = [(node, keys) for step, node, keys in grid.down if step == row['step']]
    assert messages and row['bytes_down'] == sum(sum(keys.values()) for _, keys in messages)
    for node, keys in messages:
      sent_once = sorted(k.removeprefix('once/') for k in keys if k.startswith('once/'))
      assert sent_once == ([] if node in seen else once), (row['step'], node)
      if sent_once:
        nbytes = sum(keys[f'once/{n}'] for n in once)
        assert 0 <= nbytes - plan['download_once_bytes'] <= 256 * len(once)
      assert sorted(k.removeprefix('all/') for k in keys if k.startswith('all/')) == shared
      seen.add(node)


@pytest.mark.parametrize('algorithm', sorted(ALGORITHMS))
def test_deployed_rounds_equal_the_simulation(algorithm, tmp_path, tmp_path_factory, monkeypatch):
  monkeypatch.setattr(TaskIdentity, '_run_id', 1)  # Flower's Message needs a run and a node.
  monkeypatch.setattr(TaskIdentity, '_node_id', 0)
  monkeypatch.setattr(TaskIdentity, '_task_id', 1)
  # Trained and exported with train.num_steps=ROUNDS: both evaluate at the last round.
  trained = trained_and_exported(tmp_path_factory, algorithm)
  simulated, state = trained.rows, trained.state
  grid = deploy(trained.cfg, trained.export, tmp_path / 'run', ROUNDS, NODES)

  logs = [tmp_path / 'run' / f'node{k}.jsonl' for k in range(NODES)]  # None if never sent.
  ran = [[json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
         for log in logs]
  # One query per node, then one train message per node with a slot in the round's cohort
  # (and a handoff to a node holding a slot's client state that moves to another node).
  sent = [t for t in grid.sent if t != 'query.handoff']
  assert sent == ['query'] * NODES + ['train'] * sum(map(len, ran))
  for k, entries in enumerate(ran):  # Each node ran only its own clients.
    assert all(c % NODES == k for entry in entries for c in entry['clients'])
  assert sum(len(e['slots']) for entries in ran for e in entries) == sum(
      r['clients'] for r in simulated if 'clients' in r)  # Every cohort slot ran once.
  deployed = [json.loads(line) for line in (tmp_path / 'run' / 'server' / 'metrics.jsonl')
              .read_text().splitlines()]
  assert 'eval_loss' in simulated[-1] and 'eval_loss' not in simulated[0]
  assert [r['step'] for r in deployed] == [r['step'] for r in simulated] == [1, 2]
  for sim, dep in zip(simulated, deployed):
    shared = set(sim) & set(dep) - TIMING_FIELDS - {'step'}
    assert {'loss', 'accuracy', 'clients'} <= shared, sorted(shared)
    assert {k for k in sim if k.startswith(('dp_', 'eval_'))} <= set(dep)  # Eval rows, DP's ε.
    assert dep['clients_lost'] == dep['dropped_slots'] == 0
    for key in shared:
      np.testing.assert_allclose(dep[key], sim[key], rtol=1e-5, atol=1e-6, err_msg=key)
  plan = json.loads((trained.export / 'plan.json').read_text())
  assert any(e.get('once') for e in plan['communication']) == (algorithm == 'lora_text')
  cohorts = [json.loads(line) for line in (tmp_path / 'run' / 'server' / 'cohorts.jsonl')
             .read_text().splitlines()]
  _assert_downlink(plan, grid, cohorts)
  kept_at_clients = rounds.client_state(plan)  # On the nodes, never sent by the server.
  assert not [k for _, _, keys in grid.down for k in keys
              if k.split('/', 1)[1] in kept_at_clients]
  with np.load(tmp_path / 'run' / 'server' / 'final.npz') as final:
    assert sorted(final.files) == sorted(set(state) - set(kept_at_clients))
    for name in final.files:
      np.testing.assert_allclose(final[name], state[name], rtol=1e-5, atol=1e-6, err_msg=name)
  assert_client_state(tmp_path / 'run', NODES, kept_at_clients, state)


def assert_client_state(run, nodes: int, names: list[str], state: dict) -> None:
  """Each slot's newest client state row on the nodes is the simulation's final row."""
  newest = {}
  for k in range(nodes):
    store = client_state.Store(run / f'node{k}')
    for slot, version in store.held():
      if version >= newest.get(slot, (-1, None))[0]:
        newest[slot] = (version, store.row(slot, version))
  assert sorted(newest) == (list(range(len(state[names[0]]))) if names else [])
  for name in names:
    for slot, (_, row) in newest.items():
      np.testing.assert_allclose(row[name], state[name][slot], rtol=1e-5, atol=1e-6,
                                 err_msg=f'{name}[{slot}]')
