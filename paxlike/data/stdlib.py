"""tfds builder: the Python standard library's source, one client per top-level module."""

import dataclasses
import os
import pathlib
import sys
import sysconfig

import numpy as np
import tensorflow_datasets as tfds

from paxlike.data import local_info
from paxlike.data import split
from paxlike.errors import UserError

# Directory names that hold tests, third-party code or build artifacts, not stdlib modules.
EXCLUDED_DIRS = frozenset({'test', 'tests', 'idle_test', 'site-packages', '__pycache__'})
EXCLUDED_PREFIXES = ('config-', '_sysconfigdata_')


@dataclasses.dataclass
class StdlibConfig(tfds.core.BuilderConfig):
  """`test_fraction`: about this fraction of files (by hash of relative path) is the test split."""
  test_fraction: float = 0.05


def default_stdlib_dir() -> pathlib.Path:
  """The running interpreter's standard library directory."""
  return pathlib.Path(sysconfig.get_paths()['stdlib'])


def _excluded(name: str) -> bool:
  return name in EXCLUDED_DIRS or name.startswith(EXCLUDED_PREFIXES)


def stdlib_files(root: pathlib.Path) -> list[str]:
  """Sorted relative paths of the non-test `.py` modules under `root`."""
  files = []
  for directory, subdirs, names in os.walk(root):
    subdirs[:] = [d for d in subdirs if not _excluded(d)]  # Never descends into site-packages.
    prefix = pathlib.Path(directory).relative_to(root)
    files += [(prefix / n).as_posix() for n in names if n.endswith('.py') and not _excluded(n)]
  return sorted(files)


def client_of(rel_path: str) -> str:
  """Top-level module name: `json/decoder.py` -> `json`, `abc.py` -> `abc`."""
  first = rel_path.split('/', 1)[0]
  return first[:-3] if first.endswith('.py') else first


class Stdlib(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Source of the standard library; examples are files, `client_id` their top-level module.

  The default config is named after the running Python version, whose stdlib it reads; a
  different `source_dir` needs its own config name (the prepared data is keyed by it).
  """

  name = 'stdlib'
  VERSION = tfds.core.Version('1.0.0')
  # No url checksums file; also keeps tfds from importing the optional importlib_resources.
  code_path = None
  RELEASE_NOTES = {'1.0.0': 'Non-test .py modules; ~5% of files (by path hash) held out.'}
  BUILDER_CONFIGS = [StdlibConfig(name='python' + '.'.join(map(str, sys.version_info[:3])))]

  def __init__(self, *, source_dir: str | pathlib.Path | None = None, **kwargs):
    self.source_dir = pathlib.Path(source_dir) if source_dir else default_stdlib_dir()
    super().__init__(**kwargs)

  def source_location(self) -> pathlib.Path:
    return self.source_dir

  def source_files(self) -> dict[str, pathlib.Path]:
    """The modules the dataset is built from (their fingerprint keys the prepared data)."""
    if not (self.source_dir / 'os.py').is_file():
      raise UserError(f'not a Python standard library directory: {self.source_dir}')
    return {rel: self.source_dir / rel for rel in stdlib_files(self.source_dir)}

  def _info(self) -> tfds.core.DatasetInfo:
    return local_info.LocalDatasetInfo(
        builder=self,
        description=f'Python standard library source ({self.builder_config.name}).',
        features=tfds.features.FeaturesDict({
            'text': tfds.features.Tensor(shape=(None,), dtype=np.uint8),
            'client_id': tfds.features.Text(),
            'path': tfds.features.Text(),
        }),
    )

  def _split_generators(self, dl_manager):
    files = sorted(self.source_files())
    test = split.holdout_by_threshold(files, self.builder_config.test_fraction)
    return {
        'train': self._generate_examples([f for f, t in zip(files, test) if not t]),
        'test': self._generate_examples([f for f, t in zip(files, test) if t]),
    }

  def _generate_examples(self, files: list[str]):
    for rel in files:
      data = (self.source_dir / rel).read_bytes()
      yield rel, {'text': np.frombuffer(data, np.uint8), 'client_id': client_of(rel), 'path': rel}
