"""What lets the local launcher be stopped, killed or run out of disk and started again on the
same `--out` (issue 72): the rows written so far, a lock on `--out` (held by the launcher and
its watchdog), the signals that stop it cleanly, the check that its run dir is one to resume,
and the one line that says the disk is full or why the ServerApp failed.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import socket
import time
from pathlib import Path

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def rows_done(out: Path) -> int:
  rows = out / 'server' / 'metrics.jsonl'
  return len(rows.read_text().splitlines()) if rows.exists() else 0


def last_step(out: Path) -> int | None:
  """The step of the last row the ServerApp wrote, or None."""
  rows = out / 'server' / 'metrics.jsonl'
  lines = rows.read_text().splitlines() if rows.exists() else []
  return int(json.loads(lines[-1])['step']) if lines else None


class Stopped(BaseException):
  """SIGINT or SIGTERM reached the launcher: stop the federation, keep what is saved."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


def stop_on_signals() -> None:
  """SIGINT and SIGTERM (Ctrl-C, a timeout, a CI cancel) unwind the launcher, so that it stops
  its process groups; a second one while it does is ignored (a kill -9 is left to the
  watchdog)."""
  def stop(signum: int, frame: object) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
      signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signum)
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, stop)


def wait_for_last_checkpoint(out: Path, seconds: float = 15.0) -> None:
  """Until the checkpoint of the last row written is committed (Orbax renames its directory
  to the step's number when it is), at most `seconds`: a stop then loses no round."""
  step = last_step(out)
  deadline = time.monotonic() + seconds
  while (step is not None and not (out / 'server' / 'checkpoints' / str(step)).is_dir()
         and time.monotonic() < deadline):
    time.sleep(0.1)


def lock_out(out: Path, wait: float = 30.0) -> int:
  """An exclusive lock on `out`/launcher.lock (its descriptor), taken within `wait` seconds
  (the watchdog of a launcher killed a moment ago holds it until it has stopped that run's
  processes); UserError naming the holder when another launcher runs on `out`."""
  from paxlike.errors import UserError
  fd = os.open(out / 'launcher.lock', os.O_RDWR | os.O_CREAT, 0o644)
  deadline = time.monotonic() + wait
  while True:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      break
    except BlockingIOError:
      if time.monotonic() > deadline:
        holder = os.pread(fd, 200, 0).decode(errors='replace').strip() or 'unknown'
        os.close(fd)
        raise UserError(f'--out={out} is in use by another launcher ({holder})') from None
      time.sleep(0.2)
  try:  # Who holds it, for the message above; a full disk leaves it unsaid.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f'host {socket.gethostname()} pid {os.getpid()}\n'.encode(), 0)
  except OSError:
    pass
  return fd


def resumable(out: Path, config_json: str) -> bool:
  """Whether `out` holds a run of this launcher to resume (False: it is new or empty);
  UserError when it holds something else."""
  from paxlike.errors import UserError
  if not out.exists() or (out.is_dir() and not any(out.iterdir())):
    return False
  saved = out / 'config.json'
  if not out.is_dir() or not saved.exists() or not (out / 'app' / 'pyproject.toml').exists():
    raise UserError(f'--out={out} exists and is not a run of this launcher; '
                    'choose a new directory')
  if saved.read_text() != config_json:
    raise UserError(f'--out={out} holds a run of another config ({saved}); give its flags '
                    'to resume it, or choose a new directory')
  return True


def keep_old_logs(out: Path) -> None:
  """Moves the logs of the launches before this one to `out`/logs.K (K = 1, 2, ...)."""
  logs = out / 'logs'
  if logs.exists():
    k = 1
    while (out / f'logs.{k}').exists():
      k += 1
    logs.rename(out / f'logs.{k}')


def disk_full(out: Path) -> bool:
  """Whether `out`'s filesystem has no room left: a 64 KiB file cannot be written there."""
  probe = out / '.space_probe'
  try:
    with open(probe, 'wb') as f:
      f.write(bytes(65536))
      f.flush()
      os.fsync(f.fileno())
    return False
  except OSError as error:
    if error.errno in NO_SPACE:
      return True
    raise
  finally:
    probe.unlink(missing_ok=True)


def last_checkpoint(out: Path) -> int | None:
  """The newest committed checkpoint's round in `out`/server/checkpoints, or None."""
  found = out / 'server' / 'checkpoints'
  steps = [int(p.name) for p in found.iterdir() if p.name.isdigit()] if found.is_dir() else []
  return max(steps, default=None)


def no_space_message(out: Path, path: str | Path) -> str:
  """One line: the disk of `path` (under `out`) is full, and where the run can resume from."""
  step = last_checkpoint(out)
  kept = (f'the last complete checkpoint is round {step} '
          f'({out / "server" / "checkpoints" / str(step)})' if step is not None
          else 'no round was checkpointed')
  return (f'no space left on the device of {path}; {kept}: free space and run the same '
          'command to resume')


def server_app_failure(runs_json: Path) -> str | None:
  """Why the latest failed run in `runs_json` (`flwr ls --format json`) failed, as Flower
  recorded it ("ServerApp failed with exception: ..."), on one line; None when none failed or
  the file is missing or unreadable."""
  try:
    runs = json.loads(runs_json.read_text()).get('runs', [])
  except (OSError, ValueError, AttributeError):
    return None
  failed = [r for r in runs if str(r.get('status', '')).endswith(':failed')
            and str(r.get('status-details') or '').strip()]
  if not failed:
    return None
  latest = max(failed, key=lambda r: str(r.get('finished-at') or ''))
  return ' '.join(str(latest['status-details']).split())
