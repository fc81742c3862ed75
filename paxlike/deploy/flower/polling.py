"""A Grid that collects replies every 0.1 s: flwr 1.42's `Grid.send_and_receive` sleeps 3 s
between pulls, so a reply waited on average 1.5 s (per round, per SecAgg+ stage) after it
arrived at the SuperLink."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from flwr.app import Message

POLL = 0.1  # Seconds between pulls of the replies.


class PolledGrid:
  """`grid` with `send_and_receive` pulling every POLL seconds; everything else is `grid`'s."""

  def __init__(self, grid: Any):
    self._grid = grid

  def __getattr__(self, name: str) -> Any:
    return getattr(self._grid, name)

  def send_and_receive(self, messages: Iterable[Message], *,
                       timeout: float | None = None) -> list[Message]:
    """Pushes `messages`, then the replies that arrive within `timeout` seconds (None: all)."""
    waiting = set(self._grid.push_messages(messages))
    deadline = None if timeout is None else time.monotonic() + timeout
    replies: list[Message] = []
    while waiting:
      got = list(self._grid.pull_messages(waiting))
      replies += got
      waiting -= {m.metadata.reply_to_message_id for m in got}
      if not waiting or (deadline is not None and time.monotonic() >= deadline):
        break
      time.sleep(POLL)
    return replies


def polled(grid: Any) -> Any:
  """`grid` as a PolledGrid when it pushes and pulls messages (Flower's); else `grid` itself
  (the tests' in-process Grid, which answers at once)."""
  if hasattr(grid, 'push_messages') and hasattr(grid, 'pull_messages'):
    return PolledGrid(grid)
  return grid
