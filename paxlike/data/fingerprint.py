"""Content fingerprints of a dataset's source files, and their record in a job dir.

A prepared tfds dataset lives under a directory named by its source's fingerprint, so a changed
corpus is prepared afresh instead of read stale from the cache. The fingerprint hashes every
source file's name (relative to its dataset) and content: the same files copied elsewhere keep
it, and touching a file without changing it does not matter. `digest` reads the files (memoized
per file state in a process): the bundled corpora are small. A user's corpus is hashed for its
token store through file_hashes.py, which reads a file only when its stat changed.
A job dir records the fingerprint of the data it trained on; a resume on changed data is refused.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from paxlike.core import files
from paxlike.errors import UserError

FILE = 'data_fingerprint.json'


def file_sha256(path: Path) -> str:
  """The sha256 of the content of the file at `path` (reads all of it)."""
  with open(path, 'rb') as f:
    return hashlib.file_digest(f, 'sha256').hexdigest()


@functools.lru_cache(maxsize=4096)
def _memoized_sha256(path: str, size: int, mtime_ns: int) -> str:
  del size, mtime_ns  # Only key the cache: a rewritten file changes at least one of them.
  return file_sha256(Path(path))


def combined(hashes: Mapping[str, str]) -> str:
  """sha256 over the sorted (name, content sha256) pairs of `hashes` (name -> sha256)."""
  h = hashlib.sha256()
  for name in sorted(hashes):
    h.update(f'{name}\0{hashes[name]}\n'.encode())
  return h.hexdigest()


def digest(files: Mapping[str, Path]) -> str:
  """`combined` of the content sha256 of `files` (name -> path), each file read."""
  hashes = {}
  for name, path in files.items():
    stat = os.stat(path)
    hashes[name] = _memoized_sha256(str(path), stat.st_size, stat.st_mtime_ns)
  return combined(hashes)


def mismatch(job_dir: Path, current: dict[str, Any] | None) -> str | None:
  """What differs between the data `job_dir` was trained on and `current`, or None (also when
  either side has no record)."""
  saved_path = job_dir / FILE
  if current is None or not saved_path.is_file():
    return None
  saved = json.loads(saved_path.read_text())
  if saved.get('sha256') == current['sha256'] and saved.get('dataset') == current['dataset']:
    return None
  return (f'{job_dir} was trained on {saved.get("dataset")} data with fingerprint '
          f'{str(saved.get("sha256"))[:12]}, but the data now has {current["sha256"][:12]} '
          f'({current["source"]})')


def check_resume(job_dir: Path, current: dict[str, Any] | None, allow_change: bool) -> None:
  """Refuses (UserError) to continue a job dir trained on data whose fingerprint differs from
  `current`, unless `allow_change`. A job dir without a record is accepted."""
  differs = None if allow_change else mismatch(job_dir, current)
  if differs:
    raise UserError(f'{differs}; use another --job_log_dir or pass --allow_config_change')


def record(job_dir: Path, current: dict[str, Any] | None) -> None:
  """Writes `current` to the job dir's data_fingerprint.json (atomically)."""
  if current is None:
    return
  files.write_json(job_dir / FILE, current)
