"""A lost holder of a client's state (slot_versions.py, client_state.py), at the unit level: a
slot whose newest row no connected node can hand over starts again from the export's row
(version `start_step`, every node has it) and is listed in `state_reset_slots`; a holder that
is connected but no longer has that version (or fails the handoff) counts as lost; a node that
returns listing the version is its holder again, so nothing is reset."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import Error, Message
from flwr.supercore.task_identity import TaskIdentity

from paxlike.deploy.flower import client_app, client_state, records, rounds
from paxlike.deploy.flower.slot_versions import Versions

START = 4  # The export starts after round 4: version 4 is the export's own row.
PLAN = {'inputs': [{'name': 'controls', 'placement': 'clients', 'carried': True},
                   {'name': 'params', 'placement': 'server', 'carried': True}],
        'start_step': START, 'clients': 3}


@pytest.fixture(autouse=True)
def _message_identity(monkeypatch):
  monkeypatch.setattr(TaskIdentity, '_run_id', 1)  # Flower's Message needs a run and a node.
  monkeypatch.setattr(TaskIdentity, '_node_id', 0)
  monkeypatch.setattr(TaskIdentity, '_task_id', 1)


def _after_round_5() -> Versions:
  """Round 5 ran slots 0 and 2 on node 10, slot 1 on node 11."""
  versions = Versions(PLAN, {})
  assert versions.of([0, 1, 2]) == [START] * 3  # A fresh run: the export's rows.
  versions.ran({0: 10, 1: 11, 2: 10}, 5)
  return versions


class _Grid:
  """Answers each handoff message through `answer(node, message)`."""

  def __init__(self, answer):
    self.answer, self.asked = answer, []

  def send_and_receive(self, messages, timeout):
    self.asked += [(m.metadata.dst_node_id, list(m.content['handoff']['slots']))
                   for m in messages]
    return [self.answer(m.metadata.dst_node_id, m) for m in messages]


def test_a_lost_holders_slots_start_again_from_the_exports_row():
  versions = _after_round_5()
  versions.forget({10})  # Node 10 left with slots 0 and 2's rows.
  by_node = {11: [1, 2], 12: [0]}
  assert versions.handoffs(by_node, {11: 'b', 12: 'c'}, 6) == []  # No one to ask.
  assert versions.reset_missing(by_node, {}) == [0, 2]
  assert versions.of([0, 1, 2]) == [START, 5, START]  # What the train messages name.
  assert versions.holder == {1: 11}
  versions.ran({0: 12, 1: 11, 2: 11}, 6)
  assert versions.of([0, 1, 2]) == [6, 6, 6] and versions.reset_missing(by_node, {}) == []


def test_a_lost_holders_slot_outside_the_cohort_waits_and_a_returning_node_recovers_it():
  versions = _after_round_5()
  versions.forget({10})
  assert versions.reset_missing({11: [1]}, {}) == []  # Slots 0 and 2 did not run: kept.
  assert versions.of([0, 2]) == [5, 5]
  # Node 10 restarted (a new node id, its state-dir kept) lists what it holds; a stale version
  # elsewhere is not taken.
  versions.learn({13: ['0@5', '2@5', '2@3'], 14: ['0@4']})
  assert versions.holder == {0: 13, 1: 11, 2: 13}
  by_node = {13: [0], 11: [1, 2]}
  asked = versions.handoffs(by_node, {11: 'b', 13: 'd'}, 6)
  assert [(m.metadata.dst_node_id, list(m.content['handoff']['slots']),
           list(m.content['handoff']['versions'])) for m in asked] == [(13, [2], [5])]


def test_a_holder_that_no_longer_has_the_version_or_fails_counts_as_lost(tmp_path):
  """Node 10 kept slot 0's newest KEEP versions, so it cannot hand over an older one; node 11
  fails its handoff. Node 12's slots: 0 (on node 10 only at an older version than named) and
  1 (node 11's). Both start again from the export's row; slot 2, handed over sealed, does not."""
  store10 = client_state.Store(tmp_path / 'node10')
  for step in range(5, 6 + client_state.KEEP):
    store10.put(0, step, {'controls': np.full(2, step, np.float32)})
  store10.put(2, 5, {'controls': np.ones(2, np.float32)})
  store10.save()
  assert (0, 5) not in store10.held() and (2, 5) in store10.held()
  versions = _after_round_5()  # Names slot 0 at version 5, which node 10 has dropped.
  key12 = client_state.node_key(tmp_path / 'node12')
  contexts = {10: SimpleNamespace(node_config={'state-dir': str(tmp_path / 'node10')})}

  def answer(node: int, message: Message) -> Message:
    return client_app.handoff(message, contexts[node]) if node == 10 else _error(message)
  grid = _Grid(answer)
  by_node = {12: [0, 1, 2]}
  messages = versions.handoffs(by_node, {12: client_state.public_hex(key12)}, 6)
  sealed, relayed = versions.sealed(grid, messages, 1.0)
  assert sorted(grid.asked) == [(10, [0, 2]), (11, [1])]
  assert sorted(sealed) == [2] and relayed > 0
  row = client_state.unseal(key12, sealed[2], 2, 5)  # Only node 12 can read it.
  np.testing.assert_array_equal(row['controls'], np.ones(2, np.float32))
  assert versions.reset_missing(by_node, sealed) == [0, 1]
  assert versions.of([0, 1, 2]) == [START, START, 5]


def _error(message: Message) -> Message:
  return Message(Error(code=0, reason='the ClientApp failed'), reply_to=message)


@pytest.mark.slow  # The shared DiLoCo trainer run and export (seconds, once per pytest run).
def test_a_reset_slot_on_a_node_without_its_row_reads_the_exports_row(tmp_path_factory,
                                                                      tmp_path):
  """What a node does with a reset slot: the train message names version start_step, which no
  store holds; the node reads the export's own row for that slot."""
  from paxlike.export import run as executor
  from tests.export.export_task import trained_and_exported
  trained = trained_and_exported(tmp_path_factory, 'diloco')
  plan = records.read_plan(trained.export)
  carried = executor.load(trained.export).carried
  context = SimpleNamespace(node_config={'state-dir': str(tmp_path / 'node'),
                                         'export-dir': str(trained.export)})
  names = rounds.client_state(plan)
  store, rows = client_app._state_rows(context, plan, [1], [plan['start_step']], {})
  assert names and store.held() == [] and sorted(rows[1]) == sorted(names)
  for name in names:
    np.testing.assert_array_equal(rows[1][name], carried[name][1], err_msg=name)
  with pytest.raises(ValueError, match='slot 1\'s client state after round'):
    client_app._state_rows(context, plan, [1], [plan['start_step'] + 1], {})
