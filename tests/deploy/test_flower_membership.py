"""Which nodes a deployed run admits (membership.py), against a stand-in for Flower's Grid: a
node of another config or plan, one claiming a held client and one that never answers are
refused in one line each; a lost node's clients leave the federation, as do those of a node
Flower no longer lists."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
from flwr.app import ConfigRecord
from flwr.supercore.task_identity import TaskIdentity

from paxlike.deploy.flower import membership

IDENTITY = {'config_sha256': 'c' * 64, 'plan_sha256': 'p' * 64}


class Grid:
  """Answers each node's query with `answers[node]` (None: no answer in time)."""

  def __init__(self, answers: dict[int, dict | None]):
    self.answers, self.asked = answers, []

  def get_node_ids(self) -> list[int]:
    return list(self.answers)

  def send_and_receive(self, messages, timeout):
    replies = []
    for message in messages:
      node = message.metadata.dst_node_id
      self.asked.append(node)
      if self.answers[node] is not None:
        replies.append(SimpleNamespace(metadata=SimpleNamespace(src_node_id=node),
                                       has_error=lambda: False,
                                       content={'node': ConfigRecord(self.answers[node])}))
    return replies


def _answer(clients: list[int], **hashes: str) -> dict:
  return {'clients': clients, 'sizes': [10 + c for c in clients], **IDENTITY, **hashes}


def test_nodes_are_admitted_or_refused_in_one_line_and_the_lost_leave(tmp_path, monkeypatch):
  monkeypatch.setattr(TaskIdentity, '_run_id', 1)  # Flower's Message needs a run and a node.
  monkeypatch.setattr(TaskIdentity, '_node_id', 0)
  monkeypatch.setattr(TaskIdentity, '_task_id', 1)
  grid = Grid({1: _answer([0, 2]), 2: _answer([1]), 3: _answer([3], config_sha256='x' * 64),
               4: _answer([2]), 5: None, 6: _answer([3], plan_sha256='y' * 64)})
  members = membership.Members(grid, IDENTITY, 4, tmp_path / 'nodes.jsonl')
  members.ask_new(timeout=1)
  assert members.owner == {0: 1, 2: 1, 1: 2}
  np.testing.assert_array_equal(members.sizes, [10, 11, 12, 0])
  events = [json.loads(line) for line in (tmp_path / 'nodes.jsonl').read_text().splitlines()]
  refused = {e['node']: e['reason'] for e in events if e['event'] == 'refused'}
  assert sorted(refused) == [3, 4, 5, 6]
  assert 'config_sha256' in refused[3] and 'plan_sha256' in refused[6]
  assert 'client 2' in refused[4] and 'no reply' in refused[5]
  assert all('\n' not in reason for reason in refused.values())
  members.ask_new(timeout=1)  # Nobody new: nobody is asked twice.
  assert sorted(grid.asked) == [1, 2, 3, 4, 5, 6]
  assert members.live() == [0, 1, 2]
  members.lose(1, step=7)
  assert members.owner == {1: 2} and members.nodes() == 1 and members.live() == [1]
  assert json.loads((tmp_path / 'nodes.jsonl').read_text().splitlines()[-1]) == {
      'event': 'lost', 'node': 1, 'step': 7, 'clients': [0, 2]}
  members.drop_disconnected(step=8)  # Node 2 is still listed: it stays.
  assert members.live() == [1]
  del grid.answers[2]  # Flower no longer lists node 2 (unregistered, or its heartbeat lapsed).
  members.drop_disconnected(step=8)
  assert members.live() == [] and members.nodes() == 0
  assert json.loads((tmp_path / 'nodes.jsonl').read_text().splitlines()[-1]) == {
      'event': 'lost', 'node': 2, 'step': 8, 'clients': [1]}
