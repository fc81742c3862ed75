"""Whether a token store's files are still the ones its build wrote.

A build records each file's size and CRC-32 in the manifest (`Checksums`, updated as the files
are written, so it costs no second pass). Opening a store checks the sizes every time (free)
and the checksums when the files' (size, mtime) differ from the last verified ones, kept in
`verified.json`: a truncated file, or ids overwritten in place, are found before step 1 and
never reach the model, while an untouched store is read only once.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from paxlike.core import files

VERIFIED = 'verified.json'
BLOCK = 1 << 24


class Checksums:
  """Running CRC-32s of the files a build writes, by file name."""

  def __init__(self) -> None:
    self.crc: dict[str, int] = {}

  def add(self, name: str, data: bytes | memoryview) -> None:
    self.crc[name] = zlib.crc32(data, self.crc.get(name, 0))

  def record(self) -> dict[str, str]:
    return {name: f'{crc:08x}' for name, crc in sorted(self.crc.items())}


def expected_sizes(manifest: dict[str, Any], names: dict[str, int]) -> dict[str, int]:
  """File name -> byte size the manifest implies. `names`: the per-document arrays' item sizes
  (doc_start has one entry more than there are documents)."""
  itemsize = np.dtype(manifest['token_dtype']).itemsize
  sizes = {f'tokens-{i:05d}.bin': n * itemsize for i, n in enumerate(manifest['shards'])}
  docs = manifest['num_docs']
  sizes |= {f'{name}.bin': (docs + (name == 'doc_start')) * size for name, size in names.items()}
  return sizes


def _crc_of(path: Path) -> str:
  crc = 0
  with open(path, 'rb') as f:
    while block := f.read(BLOCK):
      crc = zlib.crc32(block, crc)
  return f'{crc:08x}'


def _signature(path: Path, names: list[str]) -> dict[str, list[int]]:
  stats = {name: (path / name).stat() for name in names}
  return {name: [s.st_size, s.st_mtime_ns] for name, s in stats.items()}


def damage(path: Path, sizes: dict[str, int], checksums: dict[str, str] | None) -> str | None:
  """What is wrong with the store at `path` (a missing file, a size, a checksum), or None.
  `sizes`: file -> expected bytes; `checksums`: file -> CRC-32 (None: a store built before
  checksums, checked by size only)."""
  for name, size in sizes.items():
    file = path / name
    if not file.is_file():
      return f'{name} is missing'
    if file.stat().st_size != size:
      return f'{name} has {file.stat().st_size} bytes, its build wrote {size}'
  if not checksums:
    return None
  signature = _signature(path, sorted(checksums))
  try:
    if json.loads((path / VERIFIED).read_text()) == signature:
      return None
  except (OSError, ValueError):
    pass
  for name, want in checksums.items():
    got = _crc_of(path / name)
    if got != want:
      return f'{name} changed since its build (CRC-32 {got}, built {want})'
  try:
    files.write_text(path / VERIFIED, json.dumps(signature))
  except OSError:  # A read-only store is verified again next time.
    pass
  return None
