"""The values a plan broadcasts `once` (a frozen LoRA base): the server sends one to a node only
when the node does not hold it yet, or when it changed; the node keeps what it got in Flower's
`context.state`, which its SuperNode keeps between the run's messages.

A ServerApp starts knowing of no node that holds anything, so a restarted one (a new Flower
run, whose nodes start with a fresh `context.state`) sends the values again in its first round.
"""

from __future__ import annotations

from typing import Any

import numpy as np

KEPT = 'paxlike.once'  # The ArrayRecord in a node's context.state.


def names(plan: dict[str, Any]) -> list[str]:
  """The values the plan broadcasts once."""
  return [e['value'] for e in plan['communication']
          if e['kind'] == 'broadcast' and e.get('once')]


class Sent:
  """Which node holds which once value, as the server sent them."""

  def __init__(self, plan: dict[str, Any]):
    self.names = names(plan)
    self.last: dict[str, np.ndarray] = {}  # The value last sent, by name.
    self.held: dict[int, set[str]] = {}  # node -> the names it holds.

  def due(self, node: int, env: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The once values `node` must be sent this round (it lacks them, or they changed since it
    got them), recorded as sent."""
    for name in self.names:
      if name in self.last and not np.array_equal(self.last[name], env[name]):
        for held in self.held.values():
          held.discard(name)
      self.last[name] = env[name]
    held = self.held.setdefault(node, set())
    sent = {name: env[name] for name in self.names if name not in held}
    held.update(sent)
    return sent


def kept(context: Any, received: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The node's once values: what it kept in `context.state`, updated with those `received`
  (which it keeps for the next message)."""
  from paxlike.deploy.flower import records
  state = context.state
  held = records.from_record(state[KEPT]) if KEPT in state else {}
  if received:
    held.update(received)
    state[KEPT] = records.to_record(held)
  return held
