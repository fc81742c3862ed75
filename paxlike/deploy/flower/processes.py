"""The local federation's processes: free ports, Flower's files under FLWR_HOME, and process
groups started and stopped together."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from paxlike.deploy.flower import reaper
from paxlike.deploy.flower.reaper import descendants, running  # noqa: F401 (re-exported)

BIN = Path(sys.executable).parent  # flower-superlink, flower-supernode, flwr: beside python.
QUIET = {'FLWR_DISABLE_UPDATE_CHECK': '1', 'FLWR_TELEMETRY_ENABLED': '0'}
# A SuperExec looks for a task (a ClientApp or ServerApp process to start) every second by
# default; every message waited half of that on average.
FAST = {'FLWR_SUPEREXEC_TASK_POLL_INTERVAL': '0.2'}


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on now."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen) -> bool:
  """Whether something accepts connections on 127.0.0.1:`port` within `timeout` seconds while
  `proc` (the server meant to) is alive."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline and proc.poll() is None:
    with socket.socket() as s:
      if s.connect_ex(('127.0.0.1', port)) == 0:
        return True
    time.sleep(0.2)
  return False


def listeners(port: int) -> set[int] | None:
  """The pids of the processes holding a listening TCP socket on `port` (IPv4 or IPv6), from
  /proc/net and each process's fds; None when no socket listens there."""
  inodes = set()
  for table in ('/proc/net/tcp', '/proc/net/tcp6'):
    try:
      lines = Path(table).read_text().splitlines()[1:]
    except OSError:
      continue
    for line in lines:
      fields = line.split()
      if fields[3] == '0A' and int(fields[1].rsplit(':', 1)[1], 16) == port:
        inodes.add(f'socket:[{fields[9]}]')
  if not inodes:
    return None
  owners = set()
  for entry in filter(str.isdigit, os.listdir('/proc')):
    try:
      fds = os.listdir(f'/proc/{entry}/fd')
    except OSError:
      continue
    for fd in fds:
      try:
        if os.readlink(f'/proc/{entry}/fd/{fd}') in inodes:
          owners.add(int(entry))
          break
      except OSError:
        continue
  return owners


def wait_to_listen(port: int, timeout: float, proc: subprocess.Popen) -> str:
  """Until `proc` (or a process below it) alone listens on `port`: 'ours'; 'taken' as soon
  as another process listens there too (one we cannot see counts as another); 'exited' when
  `proc` exits first; 'timeout' after `timeout` seconds."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      return 'exited'
    owners = listeners(port)
    if owners is not None:
      ours = {proc.pid, *descendants(proc.pid)}
      if not owners or not owners <= ours:
        return 'taken'
      return 'ours'
    time.sleep(0.1)
  return 'timeout'


def flower_env(flwr_home: Path, first_on_path: Path | None = None) -> dict[str, str]:
  """This process's environment with Flower's home at `flwr_home` and its network calls off;
  `first_on_path` (the warm ClientApp shim's directory) before BIN on PATH."""
  path = f'{BIN}{os.pathsep}{os.environ.get("PATH", "")}'  # They start flower-superexec.
  if first_on_path is not None:
    path = f'{first_on_path.absolute()}{os.pathsep}{path}'
  return {**os.environ, **QUIET, **FAST, 'FLWR_HOME': str(flwr_home), 'PATH': path}


def wait_for_path(path: Path, timeout: float, proc: subprocess.Popen) -> bool:
  """Whether `path` exists within `timeout` seconds while `proc` (the process meant to make it)
  is alive."""
  deadline = time.monotonic() + timeout
  while not path.exists() and time.monotonic() < deadline and proc.poll() is None:
    time.sleep(0.1)
  return path.exists()


def write_connection(flwr_home: Path, name: str, address: str, ca: Path) -> None:
  """`flwr`'s config.toml with one SuperLink connection `name` at `address`, over TLS trusting
  the certificate authority `ca`."""
  flwr_home.mkdir(parents=True, exist_ok=True)
  (flwr_home / 'config.toml').write_text(
      f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\n'
      f'address = "{address}"\nroot-certificates = "{ca.absolute()}"\n')


def write_app(app_dir: Path, config: dict[str, str | int | float],
              clientapp: str = 'paxlike.deploy.flower.client_app:app') -> None:
  """A Flower app directory whose components are paxlike's ServerApp and `clientapp`, with
  `config` as run config."""
  app_dir.mkdir(parents=True, exist_ok=True)
  lines = []
  for key, value in config.items():
    lines.append(f'{key} = {value!r}' if isinstance(value, (int, float))
                 else f'{key} = "{value}"')
  (app_dir / 'pyproject.toml').write_text(
      '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n\n'
      '[project]\ndescription = "An exported paxlike round"\nlicense = "Apache-2.0"\n'
      'name = "paxlike-round"\nversion = "1.0.0"\ndependencies = []\n\n'
      '[tool.hatch.build.targets.wheel]\npackages = ["."]\n\n'
      '[tool.flwr.app]\npublisher = "paxlike"\n\n[tool.flwr.app.components]\n'
      'serverapp = "paxlike.deploy.flower.server_app:app"\n'
      f'clientapp = "{clientapp}"\n\n'
      '[tool.flwr.app.config]\n' + '\n'.join(lines) + '\n')


class Group:
  """Processes each started in its own process group, stopped together (SIGTERM, then SIGKILL
  for a group still alive after `grace` seconds). A watchdog process (reaper.py) takes them all
  down when this process dies before `stop` (kill -9 included); `lock_fd`, an open descriptor
  of a file this process holds a lock on, is held by the watchdog too, until it is done."""

  def __init__(self, env: dict[str, str], logs: Path, lock_fd: int | None = None):
    self.env, self.logs, self.procs = env, logs, []
    logs.mkdir(parents=True, exist_ok=True)
    self._watchdog, self._watch_fd = reaper.start(lock_fd)

  def start(self, name: str, args: list[str]) -> subprocess.Popen:
    log = open(self.logs / f'{name}.log', 'w')
    proc = subprocess.Popen(args, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log.close()
    self.procs.append(proc)
    reaper.register(self._watch_fd, proc.pid)
    return proc

  def stop_one(self, proc: subprocess.Popen) -> None:
    """Kills `proc`'s process group and every process below it (a SuperLink that did not get
    its port), and waits for it."""
    kill_tree(proc)

  def stop(self, grace: float = 10.0) -> None:
    # A SuperLink's flower-superexec starts a process group of its own: its members are found
    # as descendants before the leaders go, and killed after them.
    stray = {pid for proc in self.procs for pid in descendants(proc.pid)}
    for proc in self.procs:
      _signal_group(proc, signal.SIGTERM)
    for proc in self.procs:
      try:
        proc.wait(timeout=grace)
      except subprocess.TimeoutExpired:
        pass
      _signal_group(proc, signal.SIGKILL)  # Superexec children can outlive their leader.
      proc.wait()
    for pid in stray:
      try:
        os.killpg(pid, signal.SIGKILL) if os.getpgid(pid) == pid else os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace  # A killed process is gone only once it has exited.
    while any(running(pid) for pid in stray) and time.monotonic() < deadline:
      time.sleep(0.1)
    if self._watch_fd is not None:
      reaper.release(self._watch_fd, self._watchdog)
      self._watch_fd = None


def kill_tree(proc: Any) -> None:
  """SIGKILLs `proc`'s process group (it leads one) and every process below it, those in
  sessions of their own too (found before the group goes), then waits for `proc`."""
  below = descendants(proc.pid)
  _signal_group(proc, signal.SIGKILL)
  for pid in below:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  proc.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
  try:
    os.killpg(proc.pid, sig)
  except ProcessLookupError:
    pass
