"""Where source data is read from and where prepared (tfds) data is written."""

import os
import pathlib

from paxlike.errors import UserError

DATA_DIR_ENV = 'PAXLIKE_DATA_DIR'
TFDS_DIR_ENV = 'PAXLIKE_TFDS_DIR'

# Where a user without the files gets them (keyed by the folder under the data root).
DOWNLOAD_HINTS = {
    'tinyshakespeare': 'https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt',
    'fashion-mnist': 'https://github.com/zalandoresearch/fashion-mnist (data/fashion/*.gz)',
    'mnist': 'the MNIST idx files (e.g. https://ossci-datasets.s3.amazonaws.com/mnist/)',
}


def repo_root() -> pathlib.Path:
  """The directory that holds the `paxlike` package."""
  return pathlib.Path(__file__).resolve().parents[2]


def data_root() -> pathlib.Path:
  """`$PAXLIKE_DATA_DIR` if set, else `<repo root>/../shared/data` if it exists."""
  if env := os.environ.get(DATA_DIR_ENV):
    return pathlib.Path(env).expanduser()
  shared = repo_root().parent / 'shared' / 'data'
  if shared.is_dir():
    return shared
  raise UserError(
      f'no data root: set --data_dir or ${DATA_DIR_ENV}, or create {shared}')


def prepared_dir() -> pathlib.Path:
  """Where tfds writes prepared datasets: `$PAXLIKE_TFDS_DIR`, else ~/.cache/paxlike/tfds."""
  if env := os.environ.get(TFDS_DIR_ENV):
    return pathlib.Path(env).expanduser()
  return pathlib.Path.home() / '.cache' / 'paxlike' / 'tfds'


def require_file(path: pathlib.Path, dataset: str) -> pathlib.Path:
  """Returns `path` if it is a file, else raises a one-line UserError saying where to get it."""
  if not path.is_file():
    hint = DOWNLOAD_HINTS.get(dataset, 'its original source')
    raise UserError(f'missing data file {path} ({dataset}); download it from {hint}')
  return path
