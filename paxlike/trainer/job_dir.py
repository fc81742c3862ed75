"""The job directory: checks that it is safe to use, locks it, and records the run's config.

A job dir that already holds a run of a different config is refused (unless allowed), so an
experiment never silently continues from, or overwrites, someone else's checkpoints; a job dir
in which another trainer is running is refused, so two trainers never write into one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Iterator

import fiddle as fdl

from paxlike.config import config_io
from paxlike.core import files as file_io
from paxlike.errors import UserError
from paxlike.trainer import job_source


def _writable_dir(path: Path) -> Path:
  if path.exists() and not path.is_dir():
    raise UserError(f'--job_log_dir {path} exists and is not a directory')
  try:
    path.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=path):
      pass
  except OSError as error:
    raise UserError(f'--job_log_dir {path} is not writable ({error.strerror})') from None
  return path


# What the trainer writes into a job dir, by kind: a path of the wrong kind (a stray file named
# `checkpoints`) would fail only at the first save, after every step has been trained.
DIRECTORIES = ('checkpoints', 'summaries', 'summaries/train', 'summaries/eval')
FILES = ('config.json', 'config.txt', 'metrics.jsonl', 'eval_clients.jsonl',
         'data_fingerprint.json', 'trainer.lock')


def check_layout(path: Path) -> None:
  """UserError naming the first path in the job dir whose kind (file or directory) is not what
  the trainer writes there; nothing is touched."""
  for name, want_dir in [*((d, True) for d in DIRECTORIES), *((f, False) for f in FILES)]:
    entry = path / name
    if entry.exists() and entry.is_dir() != want_dir:
      kind = 'a directory' if want_dir else 'a file'
      raise UserError(f'{entry} is not {kind}, as the job dir layout needs; move it away or use '
                      'another --job_log_dir')


def saved_text(saved: Path) -> str:
  """The text of a job dir's config.json; UserError when it is not JSON (a torn write)."""
  text = saved.read_text()
  try:
    json.loads(text)
  except json.JSONDecodeError as error:
    raise UserError(f'{saved} is damaged ({error.msg} at line {error.lineno}), perhaps cut short '
                    'by a crash; check config.txt against this run and remove config.json to '
                    'continue') from None
  return text


def prepare(job_log_dir: str, cfg: fdl.Buildable, allow_change: bool,
            allow_import: Iterable[str] = ()) -> Path:
  """Creates or reuses the job dir, refusing one that holds a run of a different config.

  `allow_import`: modules the saved config may import beyond the allow-list (the user's own
  experiment module). Writes nothing into it: see `record_config`.
  """
  path = _writable_dir(Path(job_log_dir).expanduser().absolute())
  check_layout(path)
  saved = path / 'config.json'
  if saved.exists():
    text = saved_text(saved)
    try:
      old = config_io.from_json(text, str(saved), allow_import)
    except config_io.StaleConfig as error:  # Saved by an older paxlike: nothing to compare.
      if not allow_change:
        raise UserError(f'{error}; pass --allow_config_change to continue that run under '
                        'the current config, or use another --job_log_dir') from None
      print(f'warning: {error}; continuing under the current config (--allow_config_change)',
            file=sys.stderr)
      return path
    job_source.relocate(path, old)  # A moved job dir's config names the old path.
    diffs = config_io.differences(old, cfg)
    if diffs and not allow_change:
      shown = '; '.join(diffs[:3]) + ('; ...' if len(diffs) > 3 else '')
      raise UserError(f'{path} holds a run with a different config ({shown}); use another '
                      '--job_log_dir or pass --allow_config_change')
  return path


@contextlib.contextmanager
def undone_if_refused(job_log_dir: str) -> Iterator[None]:
  """Runs the block; if it raises a UserError (a start refused before step 1, e.g. an
  `init_from` of another shape), removes the job dir and its `checkpoints/` where this start
  created them and they are still empty, so the refusal leaves the file system as it was."""
  path = Path(job_log_dir).expanduser().absolute()
  created = [p for p in (path, path / 'checkpoints') if not p.exists()]
  try:
    yield
  except UserError:
    for directory in reversed(created):
      with contextlib.suppress(OSError):  # Not empty (or gone): leave it.
        directory.rmdir()
    raise


def record_config(path: Path, cfg: fdl.Buildable, notes: str = '') -> None:
  """Writes config.json and config.txt, `notes` (e.g. '# attention kernel: cudnn') ending the
  latter (call once the run has restored, so a failed start leaves the job dir as it was)."""
  file_io.write_text(path / 'config.json', config_io.to_json(cfg))
  file_io.write_text(path / 'config.txt', config_io.to_text(cfg) + notes)


LOCK = 'trainer.lock'


@contextlib.contextmanager
def trainer_lock(path: Path, primary: bool = True,
                 agree: Callable[[bool], bool] = lambda ok: ok) -> Iterator[None]:
  """Holds the job dir's trainer lock while the block runs.

  The lock is an flock on `trainer.lock`, which names its holder as `host pid`. The kernel drops
  an flock when its process dies (even by kill -9), so a lock file left by a dead trainer is free
  and is taken over; a live holder makes this a UserError naming it. Only the primary process
  of a multi-process run locks; `agree(ok)` gives every process the primary's `ok`, so all of
  them stop when it cannot lock. The file is removed on release.
  """
  fd, holder = _lock(path / LOCK) if primary else (None, None)
  try:
    if not agree(fd is not None):
      raise UserError(f'{path} is in use by another trainer ({holder or "starting"}); wait for it '
                      'to finish or use another --job_log_dir' if primary else
                      f'{path} is in use by another trainer (see process 0)')
    if holder:
      print(f'took over the trainer lock of {holder}, which has exited', file=sys.stderr)
    yield
  finally:
    if fd is not None:
      os.unlink(path / LOCK)  # Before unlocking: a trainer that locks the old file retries.
      os.close(fd)


def _lock(path: Path) -> tuple[int | None, str | None]:
  """(fd holding the flock on `path`, the previous holder it names, if any), or (None, the
  live holder)."""
  while True:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
      holder = _holder(fd)
      os.close(fd)
      if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
        return None, holder
      raise UserError(f'cannot lock {path} ({error.strerror}); the job dir needs a file system '
                      'with flock') from None
    try:
      same_file = os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:  # Its holder removed it between our open and flock.
      same_file = False
    if same_file:
      holder = _holder(fd)
      os.ftruncate(fd, 0)
      os.pwrite(fd, f'host {socket.gethostname()} pid {os.getpid()}\n'.encode(), 0)
      return fd, holder
    os.close(fd)


def _holder(fd: int) -> str | None:
  return os.pread(fd, 200, 0).decode(errors='replace').strip() or None


def existing(job_log_dir: str) -> Path:
  """A job dir that must already exist (for eval and decode)."""
  path = Path(job_log_dir).expanduser().absolute()
  if not path.is_dir():
    raise UserError(f'--job_log_dir {path} does not exist; train first')
  check_layout(path)
  return path
