"""`flower-supernode` for a local federation: Flower's own SuperNode with its waits shortened
(flower_patches.py's `supernode` patch: its loop sleeps at most SUPERNODE_POLL seconds at a
time and pulls a message's arrays `polling.sooner`). Across hosts, where many nodes poll one
SuperLink over the network, Flower's own intervals are the right ones: docs/flower.md's
deployment commands start `flower-supernode`.

    python -m paxlike.deploy.flower.supernode [flower-supernode's arguments]
"""

from __future__ import annotations

import sys


def main() -> None:
  from flwr.supernode.cli import flower_supernode

  from paxlike.deploy.flower import flower_patches
  flower_patches.apply('supernode')
  sys.argv[0] = 'flower-supernode'
  sys.exit(flower_supernode())


if __name__ == '__main__':
  main()
