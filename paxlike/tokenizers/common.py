"""What the tokenizer kinds share: reading a tokenizer file, its fingerprint, decodable ids,
flattening a batch's ids."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path
from typing import Iterable, Sequence

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


def flat_ids(ids: Sequence[Iterable[int]], lengths: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
  """(int32 [sum of lengths], int64 [len(ids)]): the sequences `ids` (lists of ints, as the
  libraries return them) back to back, in one pass over their ints, and their lengths."""
  if lengths is None:
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
  flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(lengths.sum()))
  return flat, lengths
