"""The local federation's watchdog: a process of its own that takes the launcher's Flower
processes down when the launcher dies, however it dies (kill -9 included).

The launcher starts it first (`start`), in a session of its own (so a kill of the launcher's
process group spares it), with the read end of a pipe whose write end only the launcher holds.
The launcher writes a line `PID START` for each process group it starts, and `done` once it
has stopped them itself. When the pipe ends without `done` (the launcher is gone: the kernel
closed its end), the watchdog stops every registered group and everything below them: it
freezes them (SIGSTOP, so none forks while it looks), collects their descendants again until
no new one appears (a SuperLink's `flower-superexec` and its `flwr-serverapp` run in sessions
of their own), then kills them all with SIGKILL. A pid is trusted only while its start time
is the one registered (pids are reused).

It also holds the launcher's lock on its `--out` (the descriptor passed as its second
argument): a launcher started again on the same `--out` waits until the watchdog has finished.

Only the standard library: it runs as `python -I -S reaper.py FD [LOCK_FD]`, started in ~20 ms.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _stat(pid: int) -> list[str] | None:
  try:
    return Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()
  except OSError:
    return None


def start_time(pid: int) -> int | None:
  """Process `pid`'s start time in clock ticks since boot (None when it does not exist)."""
  stat = _stat(pid)
  return int(stat[19]) if stat else None


def running(pid: int) -> bool:
  """Whether `pid` exists and has not exited (a zombie has)."""
  stat = _stat(pid)
  return stat is not None and stat[0] != 'Z'


def descendants(pid: int) -> list[int]:
  """The pids of the live processes below `pid` (children, their children, ...), from /proc."""
  return descendants_of([pid])


def descendants_of(pids: list[int]) -> list[int]:
  """The pids of the live processes below any of `pids`, from /proc."""
  parents = {}
  for entry in filter(str.isdigit, os.listdir('/proc')):
    stat = _stat(int(entry))
    if stat is not None:
      parents[int(entry)] = int(stat[1])
  found, frontier = [], set(pids)
  while frontier:
    children = {c for c, p in parents.items() if p in frontier} - set(found)
    found += sorted(children)
    frontier = children
  return found


def _signal(pid: int, sig: int) -> None:
  try:
    if os.getpgid(pid) == pid:
      os.killpg(pid, sig)
    os.kill(pid, sig)
  except (ProcessLookupError, PermissionError):
    pass


def take_down(registered: dict[int, int]) -> list[int]:
  """Freezes the registered process groups ({pid: start time}) that still run and every
  process below them, until no new one appears, then kills them all; the pids killed."""
  leaders = [pid for pid, began in registered.items()
             if start_time(pid) == began and running(pid)]
  frozen: list[int] = []
  for _ in range(50):
    new = [p for p in [*leaders, *descendants_of(leaders + frozen)] if p not in frozen]
    if not new:
      break
    for pid in new:
      _signal(pid, signal.SIGSTOP)
    frozen += new
  for pid in frozen:
    _signal(pid, signal.SIGKILL)
  return frozen


def watch(fd: int) -> None:
  """Reads registrations from `fd` until `done` (return) or its end (take everything down)."""
  registered: dict[int, int] = {}
  with os.fdopen(fd, 'r') as pipe:
    for line in pipe:
      if line.strip() == 'done':
        return
      pid, began = map(int, line.split())
      registered[pid] = began
  take_down(registered)


def start(lock_fd: int | None = None) -> tuple[subprocess.Popen, int]:
  """Starts the watchdog in a session of its own: (it, the write end of its pipe, which is
  this process's alone; register each group with `register`)."""
  read, write = os.pipe()
  fds = (read,) if lock_fd is None else (read, lock_fd)
  args = [sys.executable, '-I', '-S', str(Path(__file__).absolute()), str(read)]
  if lock_fd is not None:
    args.append(str(lock_fd))
  proc = subprocess.Popen(args, pass_fds=fds, start_new_session=True,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
  os.close(read)
  return proc, write


def register(write_fd: int, pid: int) -> None:
  """Tells the watchdog behind `write_fd` to take down process group `pid` if we die."""
  began = start_time(pid)
  if began is not None:
    os.write(write_fd, f'{pid} {began}\n'.encode())


def release(write_fd: int, proc: subprocess.Popen) -> None:
  """Tells the watchdog that the launcher stopped everything itself, and waits for it."""
  try:
    os.write(write_fd, b'done\n')
  except OSError:
    pass
  os.close(write_fd)
  proc.wait()


if __name__ == '__main__':
  for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
    signal.signal(sig, signal.SIG_IGN)  # Only the pipe's end (or `done`) ends it.
  watch(int(sys.argv[1]))
  time.sleep(0)  # The lock (argv[2], inherited) is released as this process exits.
