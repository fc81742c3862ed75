"""The server's side of the client state the nodes keep (client_state.py): which round last
updated each slot's row (its version, in the checkpoints' metadata) and, in this Flower run,
which node holds it; the handoff of a slot that moves to another node. The server never holds
a row: a handoff's bytes are sealed for the receiving node."""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict

from paxlike.deploy.flower import records, rounds

HANDOFF = 'query.handoff'


class Versions:
  """Each cohort slot's state version; the node holding it (the node that ran it in this Flower
  run, or one whose first reply lists it: `learn`)."""

  def __init__(self, plan: dict[str, Any], meta: dict[str, Any]):
    self.names = rounds.client_state(plan)
    self.start = int(plan['start_step'])
    slots = int(plan['clients']) if self.names else 0
    self.version = [int(v) for v in meta.get('state_versions') or [self.start] * slots]
    self.holder: dict[int, int] = {}

  def of(self, slots: list[int]) -> list[int]:
    return [self.version[s] for s in slots] if self.names else []

  def learn(self, held: dict[int, list[str]]) -> None:
    """Takes each node's held versions ({node: ['slot@version', ...]}, its query reply) as
    where the slots' current versions are, for the slots whose holder is not known."""
    for node, listed in held.items():
      for slot, version in (map(int, item.split('@')) for item in listed):
        if self.names and self.version[slot] == version and slot not in self.holder:
          self.holder[slot] = node

  def forget(self, nodes: set[int]) -> None:
    """The `nodes` left: the versions they held are gone with them."""
    self.holder = {s: n for s, n in self.holder.items() if n not in nodes}

  def handoffs(self, by_node: dict[int, list[int]], keys: dict[int, str], step: int
               ) -> list[Message]:
    """A `query.handoff` message to each node holding the version of a slot that runs on
    another node this round, naming the slots, versions and the receivers' public keys."""
    asks: dict[int, list[tuple[int, str]]] = {}
    for node, slots in by_node.items():
      for slot in slots:
        if not self.names or self.version[slot] == self.start or self.holder.get(slot) == node:
          continue  # The export's row (every node has it), or already on its node.
        if slot in self.holder:  # Else no connected node holds it: reset_missing.
          asks.setdefault(self.holder[slot], []).append((slot, keys[node]))
    return [Message(RecordDict({'handoff': ConfigRecord({
        'slots': [s for s, _ in asked], 'versions': [self.version[s] for s, _ in asked],
        'keys': [k for _, k in asked]})}), holder, HANDOFF, group_id=str(step))
        for holder, asked in asks.items()]

  def sealed(self, grid: Any, messages: list[Message], timeout: float
             ) -> tuple[dict[int, np.ndarray], int]:
    """({slot: its row sealed for its node}, the bytes relayed) from the handoff replies."""
    if not messages:
      return {}, 0
    got, relayed = {}, 0
    for reply in grid.send_and_receive(messages, timeout=timeout):
      if reply.has_error() or 'sealed' not in reply.content:
        continue
      relayed += records.payload_bytes(reply.content['sealed'])
      got.update({int(k): v for k, v in records.from_record(reply.content['sealed']).items()})
    return got, relayed

  def reset_missing(self, by_node: dict[int, list[int]], sealed: dict[int, np.ndarray]
                    ) -> list[int]:
    """The slots whose version no connected node could hand over (its node was lost): their
    state starts again from the export's row (version start). Sorted."""
    lost = sorted(s for node, slots in by_node.items() for s in slots
                  if self.names and self.version[s] != self.start
                  and self.holder.get(s) != node and s not in sealed)
    for slot in lost:
      self.version[slot] = self.start
      self.holder.pop(slot, None)
    return lost

  def ran(self, slots_of: dict[int, int], step: int) -> None:
    """Round `step` ran each slot in `slots_of` ({slot: node}): that node holds its new row."""
    if self.names:
      for slot, node in slots_of.items():
        self.version[slot], self.holder[slot] = step, node
