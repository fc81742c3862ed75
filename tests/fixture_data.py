"""The suite's data root, made from what the repository carries: a slice of Tiny Shakespeare
(tests/fixtures/data/tinyshakespeare/input.txt, see its README) and Fashion-MNIST-format idx
files of generated images (class templates plus noise, so a model can learn them). The real
data root's layout (paxlike.data.root) is kept: `tinyshakespeare/input.txt`, `fashion-mnist/*.gz`.
Digits and the stdlib need no file: sklearn and the running interpreter carry them."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).resolve().parent / 'fixtures' / 'data'
SHAKESPEARE_SLICE = FIXTURES / 'tinyshakespeare' / 'input.txt'
# Per split: (images file, labels file, number of generated images). A tenth of Fashion-MNIST's
# 60,000 + 10,000, so 100 label-shard clients hold 60 images each (the real ones: 600).
FASHION_FILES = {'train': ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz', 6000),
                 'test': ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz', 1000)}
NUM_CLASSES, SIDE = 10, 28
# What the full experiments read; a full_data test needs all of it in the real data root.
FULL_DATA_FILES = ('tinyshakespeare/input.txt',
                   *(f'fashion-mnist/{name}' for images, labels, _ in FASHION_FILES.values()
                     for name in (images, labels)))


def idx_bytes(array: np.ndarray) -> bytes:
  """`array` (uint8) in the idx format: magic 0x0000080N (N = ndim), big-endian int32 dims,
  then the bytes in C order (yann.lecun.com/exdb/mnist, 'FILE FORMATS')."""
  header = bytes([0, 0, 8, array.ndim]) + b''.join(d.to_bytes(4, 'big') for d in array.shape)
  return header + np.ascontiguousarray(array, np.uint8).tobytes()


def write_idx(path: Path, array: np.ndarray) -> None:
  """`array` as a gzipped idx file at `path` (the layout Fashion-MNIST ships)."""
  with gzip.open(path, 'wb', compresslevel=1) as f:
    f.write(idx_bytes(array))


def class_templates(seed: int = 0) -> np.ndarray:
  """[NUM_CLASSES, SIDE, SIDE] float patterns in [0, 1]: random 7x7 blocks scaled up 4x."""
  coarse = np.random.default_rng(seed).random((NUM_CLASSES, SIDE // 4, SIDE // 4))
  return np.kron(coarse, np.ones((4, 4)))


def fashion_like(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """`n` uint8 images [n, SIDE, SIDE] and labels [n] (classes balanced, shuffled): each image
  its class template at a random brightness, plus Gaussian noise."""
  rng = np.random.default_rng(seed)
  labels = rng.permutation(np.arange(n) % NUM_CLASSES)
  brightness = rng.uniform(0.5, 1.0, (n, 1, 1))
  pixels = brightness * class_templates()[labels] + rng.normal(0.0, 0.25, (n, SIDE, SIDE))
  return np.clip(np.rint(255 * pixels), 0, 255).astype(np.uint8), labels.astype(np.uint8)


def write_fashion_like(folder: Path) -> None:
  """The four Fashion-MNIST idx files of generated images into `folder`."""
  folder.mkdir(parents=True, exist_ok=True)
  for seed, (images_file, labels_file, n) in enumerate(FASHION_FILES.values(), start=1):
    images, labels = fashion_like(n, seed)
    write_idx(folder / images_file, images)
    write_idx(folder / labels_file, labels)


def build_data_root(path: Path) -> None:
  """A data root at `path` in the real one's layout, from the repository's files."""
  (path / 'tinyshakespeare').mkdir(parents=True)
  shutil.copyfile(SHAKESPEARE_SLICE, path / 'tinyshakespeare' / 'input.txt')
  write_fashion_like(path / 'fashion-mnist')


def missing_full_data(data_root: Path | None) -> list[str]:
  """The files of FULL_DATA_FILES that `data_root` lacks (all of them when it is None)."""
  if data_root is None:
    return list(FULL_DATA_FILES)
  return [name for name in FULL_DATA_FILES if not (data_root / name).is_file()]
