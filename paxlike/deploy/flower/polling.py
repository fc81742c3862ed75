"""Shorter waits for the ServerApp's replies and for a message's arrays (docs/flower.md,
"Polling", has the measurements).

- `PolledGrid`: the ServerApp collects replies every POLL seconds through the Grid's own
  `push_messages` and `pull_messages`, where `Grid.send_and_receive` sleeps 3 s between pulls.
- `sooner`: Flower lists a message (to a SuperNode, its ClientApp or the ServerApp) before its
  arrays have arrived, and retries a missing array's pull after 1 s, then 2 s, up to 10 s;
  sooner's retries wait PULL_BACKOFF seconds, doubling up to PULL_BACKOFF_CAP, through the
  pull functions' own backoff keywords. flower_patches.py puts it where Flower pulls.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from typing import Any, Callable

from flwr.app import Message

POLL = 0.1  # Seconds between pulls of the replies.
PULL_BACKOFF, PULL_BACKOFF_CAP = 0.02, 0.2


def sooner(pull: Callable[..., Any]) -> Callable[..., Any]:
  """Flower's `pull_objects` or `pull_and_inflate_object_from_tree`, retrying a missing array
  after PULL_BACKOFF seconds, doubling up to PULL_BACKOFF_CAP."""
  return functools.partial(pull, initial_backoff=PULL_BACKOFF, backoff_cap=PULL_BACKOFF_CAP)


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
