"""The local launcher under an operator's faults (issue 72): the launcher killed (kill -9 of its
process group, SIGINT, SIGTERM) takes its Flower processes down with it, and the same command on
the same --out resumes from the ServerApp's last checkpoint with the uninterrupted run's rows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.deploy import flower_procs as fp
from tests.helpers import REPO, cli_env

OWNER = """
import os, sys, time
from pathlib import Path
from paxlike.deploy.flower import processes
token = sys.argv[2]
group = processes.Group(dict(os.environ), Path(sys.argv[1]))
sleeper = f'import time; time.sleep(600)  # {token}'
# A leader whose child runs in a session of its own, as a SuperLink's flower-superexec does.
group.start('a', [sys.executable, '-c', 'import subprocess, sys, time; subprocess.Popen('
                  f'[sys.executable, "-c", {sleeper!r}], start_new_session=True); {sleeper}'])
group.start('b', [sys.executable, '-c', sleeper])
print('started', flush=True)
time.sleep(600)
"""


def _with_token(token: str) -> list[int]:
  return [pid for pid, (_, cmd, _) in fp.processes().items() if token in cmd]


def test_a_group_owner_killed_with_sigkill_takes_its_groups_and_their_sessions_down(tmp_path):
  """The owner of a processes.Group (the launcher) dies by SIGKILL to its process group: its
  groups, and a process one of them started in a session of its own, are gone within seconds
  (before the watchdog: all three ran on)."""
  token = uuid.uuid4().hex
  owner = subprocess.Popen([sys.executable, '-c', OWNER, str(tmp_path / 'logs'), token],
                           cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, text=True,
                           start_new_session=True)
  try:
    assert owner.stdout.readline().strip() == 'started'
    fp.wait_until(lambda: len(_with_token(token)) == 3, 30, 'the three sleepers')
    os.killpg(owner.pid, signal.SIGKILL)
    owner.wait()
    began = time.monotonic()
    fp.wait_until(lambda: not _with_token(token), 10, 'the sleepers to be gone')
    print(f'gone {time.monotonic() - began:.2f} s after the kill')
  finally:
    for pid in _with_token(token):
      os.kill(pid, signal.SIGKILL)
