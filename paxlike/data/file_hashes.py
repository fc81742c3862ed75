"""The content sha256 of corpus files, remembered by each file's stat, so that a start whose
token store exists reads no corpus byte.

The token store's key hashes every corpus file's content (token_store.store_key). At the sizes
users train on (tens to hundreds of GB) reading the corpus for that would cost minutes at every
start, in every process, so each file's hash is recorded in INDEX, in the token dir, under its
path with its stat (size, mtime_ns, ctime_ns, inode, device), and later starts take it from
there while the stat is unchanged. Writing a file changes its ctime, which no call can set back,
so a changed file is hashed again (it alone), and so is a file replaced by another (inode).

A write in the same timestamp tick as the last one leaves the same stat, so an entry is trusted
only when the file's ctime is RACY_NS older than its hashing, and only when the file's stat was
the same before and after it was read. `verify=True` (--verify_data) hashes every file again.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from paxlike.core import files
from paxlike.data import fingerprint
from paxlike.data import prepare

INDEX = 'file_hashes.json'
RACY_NS = 1_000_000_000  # At least the coarsest file timestamp granularity in use (1 s).

Entry = list  # [size, mtime_ns, ctime_ns, inode, device, hashed_ns, sha256]


def stat_key(path: Path) -> list[int]:
  """What a rewrite or a replacement of the file at `path` changes."""
  s = os.stat(path)
  return [s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino, s.st_dev]


def trusted(entry: Entry | None, key: list[int]) -> bool:
  """Whether `entry` holds the hash of the file whose stat is `key` now."""
  return entry is not None and entry[:5] == key and key[2] < entry[5] - RACY_NS


def content_hashes(files: Mapping[str, Path], index: Path, verify: bool = False
                   ) -> dict[str, str]:
  """Name -> content sha256 of `files` (name -> path): read from `index` for each file whose
  stat it records (unless `verify`), else computed, and recorded there for the next start."""
  known = read_index(index)
  hashes, hashed = {}, {}
  for name, path in files.items():
    key, entry = stat_key(path), known.get(str(path))
    if trusted(entry, key) and not verify:
      hashes[name] = entry[6]
      continue
    hashed_ns = time.time_ns()
    hashes[name] = fingerprint.file_sha256(path)
    if verify and trusted(entry, key) and entry[6] != hashes[name]:
      print(f'warning: data file {path} changed without a change to its size or times; its '
            'token store is built again', file=sys.stderr)
    if stat_key(path) == key:  # Else it changed while read: hashed again next time.
      hashed[str(path)] = [*key, hashed_ns, hashes[name]]
  if hashed:
    record(index, hashed)
  return hashes


def read_index(index: Path) -> dict[str, Entry]:
  """Path -> entry of `index`; empty when it is missing or unreadable (all is hashed again)."""
  try:
    found = json.loads(index.read_text())
  except (OSError, ValueError):
    return {}
  return found if isinstance(found, dict) else {}


def record(index: Path, entries: dict[str, Entry]) -> None:
  """Adds `entries` to `index` (atomically, under its lock, keeping other processes' entries);
  a token dir that cannot be written keeps no index (every start hashes)."""
  try:
    with prepare._locked(index.with_name(f'.{index.name}.lock')):  # pylint: disable=protected-access
      merged = {**read_index(index), **entries}
      files.write_json(index, merged, indent=None, separators=(',', ':'))
  except OSError:
    pass
