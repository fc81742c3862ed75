"""The warm ClientApp launcher's shim and server as real processes: the shim runs the real
`flwr-clientapp` when no server listens, a served call is a child forked by the server (Flower's
own argument parsing, the caller's stdout), and a forked ClientApp whose `--parent-pid` dies
exits (as a SuperNode's superexec killed with SIGKILL leaves). The federation's own use of it is
checked in test_flower_local.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from paxlike.deploy.flower import processes, warm_clientapp
from tests.deploy import flower_procs as fp
from tests.helpers import REPO, cli_env


def _shim(tmp_path: Path, socket: Path) -> Path:
  return warm_clientapp.write_shim(tmp_path / 'bin', socket, processes.BIN / 'flwr-clientapp')


def test_the_shim_runs_the_real_flwr_clientapp_when_no_server_listens(tmp_path):
  shim = _shim(tmp_path, tmp_path / 'absent.sock')
  done = subprocess.run([str(shim), '--help'], env=cli_env(), text=True, capture_output=True,
                        timeout=120)
  assert done.returncode == 0, done.stderr
  assert 'usage: flwr-clientapp' in done.stdout
  assert f'not forked by {tmp_path / "absent.sock"}' in done.stderr


@pytest.fixture(scope='module')
def server(tmp_path_factory):
  """(the shim, the server's log) of a warm server in the suite's environment."""
  root = tmp_path_factory.mktemp('warm')
  socket, log = warm_clientapp.socket_path(root), root / 'server.log'
  proc = fp.start_group([sys.executable, '-m', 'paxlike.deploy.flower.warm_clientapp',
                         '--socket', str(socket), '--bin-dir', str(root / 'bin')], log)
  try:
    fp.wait_until(socket.exists, 120, 'the warm server to listen', proc)
    yield root / 'bin' / 'flwr-clientapp', log
  finally:
    fp.stop_group(proc)


def _forked(log: Path) -> list[int]:
  return [int(line.split()[1]) for line in log.read_text().splitlines()
          if line.startswith('forked ')]


def test_a_served_call_is_forked_and_writes_to_the_callers_stdout(server, tmp_path):
  shim, log = server
  before = len(_forked(log))
  out = tmp_path / 'out'
  with open(out, 'w') as f:
    done = subprocess.run([str(shim), '--help'], env=cli_env(), stdout=f, stderr=subprocess.PIPE,
                          text=True, timeout=60, cwd=REPO)
  assert done.returncode == 0 and 'not forked' not in done.stderr, done.stderr
  fp.wait_until(lambda: 'usage: flwr-clientapp' in out.read_text(), 30, 'the child\'s help')
  forked = _forked(log)
  assert len(forked) == before + 1
  fp.wait_until(lambda: f'exited {forked[-1]} 0' in log.read_text(), 30, 'the child\'s exit')


def test_a_forked_clientapp_exits_when_its_parent_pid_dies(server, tmp_path):
  shim, log = server
  parent = subprocess.Popen(['sleep', '300'])  # Stands in for the SuperNode's superexec.
  try:
    # Nothing listens on the Runtime API address: the ClientApp retries until its parent dies.
    # Its stderr is a file: a pipe would stay open as long as the child holds it.
    with open(tmp_path / 'err', 'w') as err:
      done = subprocess.run([str(shim), '--token', 'x', '--insecure', '--runtime-api-address',
                             f'127.0.0.1:{processes.free_port()}', '--parent-pid',
                             str(parent.pid)], env=cli_env(), stderr=err, timeout=60)
    assert done.returncode == 0
    assert 'not forked' not in (tmp_path / 'err').read_text()
    child = _forked(log)[-1]
    time.sleep(1)
    assert processes.running(child)
  finally:
    parent.kill()
    parent.wait()
  fp.wait_until(lambda: f'exited {child} ' in log.read_text(), 30, 'the orphaned ClientApp')
