"""What the local launcher does while a run is in flight. It owns the federation's processes, so
it learns of a death when it happens, where Flower learns of it only when heartbeats stop
(docs/flower.md, "Flower 1.42 details this relies on"):

- a SuperNode process that exited is unregistered from the SuperLink (`flwr supernode
  unregister`, what an operator does for a node that is gone): the SuperLink marks it offline,
  so the ServerApp's message to it comes back as an error and the node is lost in that round;
- the run's ServerApp process that exited while `flwr run --stream` still streams is stopped
  (`flwr stop`), which ends the stream, so the launcher submits the app again at once.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from paxlike.deploy.flower import federation, processes

_POLL = 0.25  # Seconds between looks at the processes.
_APP_GRACE = 3.0  # Seconds a finished ServerApp's stream may take to end before a stop.


def run_id(log: Path) -> int | None:
  """The run id `flwr run` printed to `log` ("Successfully started run N"), or None yet."""
  found = re.search(r'started run (\d+)', log.read_text()) if log.exists() else None
  return int(found.group(1)) if found else None


def server_apps(link_pid: int) -> list[int]:
  """The pids of the live flwr-serverapp processes below the SuperLink `link_pid`."""
  found = []
  for pid in processes.descendants(link_pid):
    try:
      cmdline = Path(f'/proc/{pid}/cmdline').read_bytes()
    except OSError:
      continue
    if b'flwr-serverapp' in cmdline and processes.running(pid):
      found.append(pid)
  return found


class Supervisor:
  """Watches the nodes `nodes` ({name: process}) of `fed` and one `flwr run` at a time; what it
  does goes to the file `log`, a line each."""

  def __init__(self, fed: federation.Federation, nodes: dict[str, subprocess.Popen], log: Path):
    self.fed, self.nodes, self.log = fed, nodes, log
    self.unregistered: set[str] = set()

  def _event(self, text: str) -> None:
    with open(self.log, 'a') as f:
      f.write(f'{time.strftime("%H:%M:%S")} {text}\n')

  def _check_nodes(self) -> None:
    for name, proc in self.nodes.items():
      if name not in self.unregistered and proc.poll() is not None:
        self.unregistered.add(name)
        done = self.fed.unregister(name)
        self._event(f'node {name} exited ({proc.returncode}); '
                    f'{"unregistered" if done else "unregistering it failed"}')

  def wait(self, runner: subprocess.Popen, log: Path, deadline: float) -> None:
    """Until `runner` (`flwr run --stream`, writing `log`) exits; subprocess.TimeoutExpired
    at `deadline` (time.monotonic)."""
    seen_app, gone_since, tried = False, None, False
    while runner.poll() is None:
      if time.monotonic() > deadline:
        raise subprocess.TimeoutExpired(runner.args, 0)
      self._check_nodes()
      if server_apps(self.fed.link.pid):
        seen_app, gone_since = True, None
      elif seen_app and not tried:
        gone_since = gone_since or time.monotonic()
        if time.monotonic() - gone_since > _APP_GRACE and (run := run_id(log)) is not None:
          tried = True  # Once: a run that finished meanwhile refuses the stop, harmlessly.
          self._event(f'the ServerApp of run {run} exited; stopped: '
                      f'{self.fed.stop_run(run)}')
      time.sleep(_POLL)
    self._check_nodes()
