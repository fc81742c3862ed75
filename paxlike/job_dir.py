"""The job directory: checks that it is safe to use, and records the run's config in it.

A job dir that already holds a run of a different config is refused (unless allowed), so an
experiment never silently continues from, or overwrites, someone else's checkpoints.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import fiddle as fdl

from paxlike import config_io
from paxlike.errors import UserError


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


def _write_atomic(path: Path, text: str) -> None:
  tmp = path.with_name(path.name + '.tmp')
  tmp.write_text(text)
  os.replace(tmp, path)


def prepare(job_log_dir: str, cfg: fdl.Buildable, allow_change: bool) -> Path:
  """Creates or reuses the job dir, refusing one that holds a run of a different config.

  Writes nothing into it: see `record_config`.
  """
  path = _writable_dir(Path(job_log_dir).expanduser().absolute())
  saved = path / 'config.json'
  if saved.exists():
    old = config_io.from_json(saved.read_text(), str(saved))
    diffs = config_io.differences(old, cfg)
    if diffs and not allow_change:
      shown = '; '.join(diffs[:3]) + ('; ...' if len(diffs) > 3 else '')
      raise UserError(f'{path} holds a run with a different config ({shown}); use another '
                      '--job_log_dir or pass --allow_config_change')
  return path


def record_config(path: Path, cfg: fdl.Buildable, notes: str = '') -> None:
  """Writes config.json and config.txt, `notes` (e.g. '# attention kernel: cudnn') ending the
  latter (call once the run has restored, so a failed start leaves the job dir as it was)."""
  _write_atomic(path / 'config.json', config_io.to_json(cfg))
  _write_atomic(path / 'config.txt', config_io.to_text(cfg) + notes)


def existing(job_log_dir: str) -> Path:
  """A job dir that must already exist (for eval and decode)."""
  path = Path(job_log_dir).expanduser().absolute()
  if not path.is_dir():
    raise UserError(f'--job_log_dir {path} does not exist; train first')
  return path
