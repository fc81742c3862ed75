"""Which SuperNodes take part in a deployed run, and which clients each holds.

A node's first message is a `query`: it answers with its config's and its plan's hashes and its
client ids and sizes. A node whose hashes are not the run's, or that claims a client another
node holds, is refused (one line in the log and in `nodes.jsonl`) and never sent work; the run
goes on without it. A node that does not answer a round in time, or that Flower no longer lists
before a round, is lost: its clients leave the federation, so later cohorts are drawn without
them. Nodes that join later are asked before each round.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid


def file_sha256(path: str | Path) -> str:
  return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _last_line(text: str) -> str:
  lines = str(text).strip().splitlines()
  return lines[-1] if lines else '(no reason given)'


class Members:
  """The run's nodes: who was asked, who holds which client, who was refused or lost."""

  def __init__(self, grid: Grid, identity: dict[str, str], population: int, log: Path):
    """`identity`: the hashes a node must report ({'config_sha256': ..., 'plan_sha256': ...})."""
    self.grid, self.identity, self.population, self.log = grid, identity, population, log
    self.asked: set[int] = set()
    self.owner: dict[int, int] = {}  # client id -> node id, for the nodes taking part.
    self.sizes = np.zeros(population, np.int64)
    self.keys: dict[int, str] = {}  # node -> its public key for client state handoffs.
    self.held: dict[int, list[str]] = {}  # node -> the client state versions it reported.

  def _event(self, **event: Any) -> None:
    print(json.dumps(event), flush=True)
    with open(self.log, 'a') as f:
      f.write(json.dumps(event) + '\n')

  def wait_for(self, clients: int, timeout: float) -> None:
    """Asks new nodes until every one of the first `clients` client ids is held; RuntimeError
    (one line) when they are not after `timeout` seconds."""
    if hasattr(self.grid, 'push_messages'):
      return self._wait_overlapped(clients, timeout)
    deadline = time.monotonic() + timeout
    while len(self.owner) < clients:
      self.ask_new(timeout)
      if len(self.owner) >= clients:
        break
      if time.monotonic() > deadline:
        raise RuntimeError(f'{len(self.owner)} of {clients} clients are held by the nodes '
                           f'after {timeout} s')
      time.sleep(0.2)

  def _wait_overlapped(self, clients: int, timeout: float) -> None:
    """wait_for over a Grid that pushes and pulls (Flower's): a node that connects while
    others' queries are in flight is asked at once, not after their replies (a ClientApp
    process each, seconds)."""
    deadline, pending = time.monotonic() + timeout, {}  # message id -> node
    ask = ConfigRecord({'what': 'clients'})
    while len(self.owner) < clients:
      new = [node for node in self.grid.get_node_ids() if node not in self.asked]
      self.asked.update(new)
      messages = [Message(RecordDict({'ask': ask}), node, 'query') for node in new]
      ids = list(self.grid.push_messages(messages)) if messages else []
      if len(ids) != len(new) or None in ids:
        self.asked.difference_update(new)  # Not pushed: asked again in the next pass.
      else:
        pending.update(zip(ids, new))
      for reply in (self.grid.pull_messages(list(pending)) if pending else []):
        node = pending.pop(reply.metadata.reply_to_message_id)
        reason = (f'failed: {_last_line(reply.error.reason)}' if reply.has_error() else
                  self._admit(node, reply.content['node']))
        if reason is not None:
          self._event(event='refused', node=node, reason=reason)
      if len(self.owner) >= clients:
        self.asked.difference_update(pending.values())  # Asked again before the next round.
        break
      if time.monotonic() > deadline:
        for node in pending.values():
          self._event(event='refused', node=node, reason='no reply to its first message')
        raise RuntimeError(f'{len(self.owner)} of {clients} clients are held by the nodes '
                           f'after {timeout} s')
      time.sleep(0.2)

  def ask_new(self, timeout: float) -> None:
    """Sends a query to every connected node not asked yet, and admits or refuses each."""
    new = [node for node in self.grid.get_node_ids() if node not in self.asked]
    if not new:
      return
    self.asked.update(new)
    ask = ConfigRecord({'what': 'clients'})
    messages = [Message(RecordDict({'ask': ask}), node, 'query') for node in new]
    replies = {r.metadata.src_node_id: r
               for r in self.grid.send_and_receive(messages, timeout=timeout)}
    for node in new:
      reply = replies.get(node)
      reason = ('no reply to its first message' if reply is None else
                f'failed: {_last_line(reply.error.reason)}' if reply.has_error() else
                self._admit(node, reply.content['node']))
      if reason is not None:
        self._event(event='refused', node=node, reason=reason)

  def _admit(self, node: int, answer: ConfigRecord) -> str | None:
    """Admits `node` with the clients in its answer; the reason (one line) when it cannot."""
    for key, expected in self.identity.items():
      if str(answer.get(key, '')) != expected:
        return (f'its {key} {str(answer.get(key, ""))[:12]} is not the run\'s '
                f'{expected[:12]}: a different experiment or export')
    clients, sizes = list(answer['clients']), list(answer['sizes'])
    taken = [c for c in clients if c in self.owner or not 0 <= c < self.population]
    if taken:
      return f'it claims client {taken[0]}, which is out of range or held by another node'
    for client, size in zip(clients, sizes):
      self.owner[client], self.sizes[client] = node, size
    self.keys[node] = str(answer.get('state_key', ''))
    self.held[node] = [str(v) for v in answer.get('state_held', [])]
    self._event(event='joined', node=node, clients=clients)
    return None

  def lose(self, node: int, step: int) -> None:
    """`node` missed round `step`: its clients leave the federation."""
    clients = sorted(c for c, n in self.owner.items() if n == node)
    for client in clients:
      del self.owner[client]
    self._event(event='lost', node=node, step=step, clients=clients)

  def drop_disconnected(self, step: int) -> None:
    """Loses the nodes holding clients that Flower no longer lists as connected (before round
    `step`), so that the round's cohort is drawn among the clients still reachable."""
    connected = set(self.grid.get_node_ids())
    for node in sorted(set(self.owner.values()) - connected):
      self.lose(node, step)

  def live(self) -> list[int]:
    """The client ids held by the nodes taking part, sorted."""
    return sorted(self.owner)

  def nodes(self) -> int:
    return len(set(self.owner.values()))
