"""A prepared split decoded once into arrays and kept beside it, so that later starts load
arrays instead of parsing every tfds example again (the parse is most of a small run's data
time). The prepared directory is named by its source's fingerprint and never changes once
complete, so the cache goes stale only with the decoding code: `VERSION` names it."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

from paxlike.core import files

VERSION = 1
Arrays = dict[str, np.ndarray]


def path_of(directory: str, split: str, kind: str) -> Path:
  """Where the decoded `kind` of `split` of the prepared `directory` is kept."""
  return Path(directory) / f'{kind}-{split}.v{VERSION}.npz'


def cached(directory: str, split: str, kind: str, decode: Callable[[], Arrays]) -> Arrays:
  """`decode()`, read from its cache file when one exists, else computed and written there
  atomically (a directory that cannot be written keeps no cache: every start decodes)."""
  path = path_of(directory, split, kind)
  try:
    with np.load(path, allow_pickle=False) as found:
      return {k: found[k] for k in found.files}
  except (OSError, EOFError, ValueError, zipfile.BadZipFile):  # Absent or damaged: decode.
    pass
  arrays = decode()
  try:
    with files.open_atomic(path, binary=True) as file:
      np.savez(file, **arrays)
  except OSError:
    pass
  return arrays
