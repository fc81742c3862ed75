"""What the tokenizer kinds share: reading a tokenizer file, its fingerprint, decodable ids."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Sequence

import numpy as np

from paxlike.errors import UserError


def read_tokenizer_file(path: Path) -> bytes:
  """The bytes of the tokenizer file `path`; a missing or unreadable file is a UserError."""
  try:
    return path.read_bytes()
  except FileNotFoundError:
    raise UserError(f'tokenizer {path}: no such file') from None
  except OSError as error:
    raise UserError(f'tokenizer {path}: cannot read it ({error.strerror})') from None


def fingerprint(data: bytes) -> str:
  """sha256 hex of a tokenizer file's bytes."""
  return hashlib.sha256(data).hexdigest()


def decodable_ids(ids: Sequence[int], pad_id: int, vocab_size: int) -> list[int]:
  """`ids` as Python ints without pad and without ids outside [0, vocab_size): a model's vocab
  is the tokenizer's rounded up (`vocab_for_model`), so a sampler may emit ids no piece has."""
  array = np.asarray(ids, np.int64).ravel()
  return array[(array != pad_id) & (array >= 0) & (array < vocab_size)].tolist()


def int32_ids(ids: Sequence[int]) -> np.ndarray:
  return np.asarray(ids, np.int32)
