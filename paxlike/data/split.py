"""Deterministic, content-independent train/test assignment from stable hashes."""

from collections.abc import Hashable, Sequence
import hashlib
import math

import numpy as np


def hash_unit(key: str) -> float:
  """A stable pseudo-random number in [0, 1) for `key` (sha256; not Python's salted hash)."""
  digest = hashlib.sha256(key.encode('utf-8')).digest()
  return int.from_bytes(digest[:8], 'big') / 2.0**64


def holdout_by_threshold(keys: Sequence[str], fraction: float) -> np.ndarray:
  """Bool mask: key is held out iff hash_unit(key) < fraction (about `fraction` of keys)."""
  return np.array([hash_unit(k) < fraction for k in keys], dtype=bool)


def holdout_per_group(keys: Sequence[str], groups: Sequence[Hashable],
                      fraction: float) -> np.ndarray:
  """Bool mask holding out round(fraction * n_g) keys of each group g: those with smallest hash."""
  mask = np.zeros(len(keys), dtype=bool)
  members: dict[Hashable, list[int]] = {}
  for i, g in enumerate(groups):
    members.setdefault(g, []).append(i)
  for idx in members.values():
    n_test = math.floor(fraction * len(idx) + 0.5)
    ranked = sorted(idx, key=lambda i: (hash_unit(keys[i]), keys[i]))
    mask[ranked[:n_test]] = True
  return mask
