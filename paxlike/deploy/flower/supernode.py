"""`flower-supernode` for a local federation: Flower's own SuperNode, with its waits capped at
POLL seconds and its pulls of a message's arrays retried `polling.sooner`.

flwr 1.42's SuperNode sleeps 3 s after each pull that found no message and 0.5 s at a time while
it waits for a ClientApp's reply, so every message (a round's train message, each SecAgg+ stage)
waited about 1.75 s on average before any work began; and it lists a message before the
ServerApp has pushed its arrays, whose pull then retries after 1 s, then 2 s. On one machine a
pull is a loopback call; across hosts, where a pull crosses the network to a SuperLink that many
nodes poll, Flower's own intervals are the right ones, and docs/flower.md's deployment commands
start `flower-supernode`.

    python -m paxlike.deploy.flower.supernode [flower-supernode's arguments]
"""

from __future__ import annotations

import sys
import time
from typing import Any

# Seconds: the most the SuperNode's loop sleeps at a time. Each wake is an HTTPS pull that the
# SuperLink answers from its database: at 0.1 s, a few nodes' pulls kept the SuperLink busy on
# a machine whose cores the ClientApps need (docs/flower.md, "Polling").
POLL = 0.3


class _CappedSleeps:
  """The `time` module as the SuperNode's loop sees it: `sleep` waits at most POLL seconds."""

  def __getattr__(self, name: str) -> Any:
    return getattr(time, name)

  @staticmethod
  def sleep(seconds: float) -> None:
    time.sleep(min(seconds, POLL))


def shorten_waits() -> None:
  """In this process, Flower's SuperNode loop sleeps at most POLL seconds at a time and pulls a
  message's arrays `polling.sooner`."""
  from flwr.supernode import start_client_internal
  from paxlike.deploy.flower import polling
  start_client_internal.time = _CappedSleeps()
  start_client_internal.pull_objects = polling.sooner(start_client_internal.pull_objects)


def main() -> None:
  from flwr.supernode.cli import flower_supernode
  shorten_waits()
  sys.argv[0] = 'flower-supernode'
  sys.exit(flower_supernode())


if __name__ == '__main__':
  main()
