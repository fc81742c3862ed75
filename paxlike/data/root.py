"""Where source data is read from and where prepared (tfds) data is written.

The data root (Tiny Shakespeare, Fashion-MNIST, MNIST) is, first found:
1. `--data_dir` or `$PAXLIKE_DATA_DIR` (it must exist);
2. `../shared/data` beside the checkout, when paxlike runs from a source checkout;
3. the user cache: `$XDG_CACHE_HOME/paxlike/data`, by default `~/.cache/paxlike/data`.
Prepared tfds datasets go to `$PAXLIKE_TFDS_DIR`, else `<user cache>/paxlike/tfds`.
"""

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
  """The directory that holds the `paxlike` package (a checkout, or site-packages)."""
  return pathlib.Path(__file__).resolve().parents[2]


def user_cache_dir() -> pathlib.Path:
  """`$XDG_CACHE_HOME/paxlike`, else `~/.cache/paxlike`."""
  return pathlib.Path(os.environ.get('XDG_CACHE_HOME') or pathlib.Path.home() / '.cache') / 'paxlike'


def data_root() -> pathlib.Path:
  """The data root (see the module docstring); an explicit one that does not exist is a
  UserError, the user cache default need not exist yet."""
  if env := os.environ.get(DATA_DIR_ENV):
    path = pathlib.Path(env).expanduser()
    if not path.is_dir():
      raise UserError(f'data dir {path} (--data_dir or ${DATA_DIR_ENV}) does not exist')
    return path
  shared = repo_root().parent / 'shared' / 'data'
  if (repo_root() / 'pyproject.toml').is_file() and shared.is_dir():
    return shared
  return user_cache_dir() / 'data'


def prepared_dir() -> pathlib.Path:
  """Where tfds writes prepared datasets: `$PAXLIKE_TFDS_DIR`, else `<user cache>/tfds`."""
  if env := os.environ.get(TFDS_DIR_ENV):
    return pathlib.Path(env).expanduser()
  return user_cache_dir() / 'tfds'


def require_file(path: pathlib.Path, dataset: str) -> pathlib.Path:
  """Returns `path` if it is a file, else raises a one-line UserError saying how to place it."""
  if not path.is_file():
    hint = DOWNLOAD_HINTS.get(dataset, 'its original source')
    raise UserError(f'missing data file {path} ({dataset}): download it from {hint} into '
                    f'{path.parent}, or point --data_dir (${DATA_DIR_ENV}) at a directory '
                    f'holding {dataset}/{path.name}')
  return path
