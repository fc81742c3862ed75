"""Named datasets: build once under a file lock into prepared_dir(), then read with random access.

tfds and the builders are imported when a named dataset is first used, so a run on the user's
own text (TextData) never pays for them."""

from __future__ import annotations

import contextlib
import fcntl
import io
import pathlib
import shutil
import sys
from collections.abc import Iterator, Sequence
import importlib
from typing import TYPE_CHECKING, Any

from paxlike.data import fingerprint
from paxlike.data import root
from paxlike.errors import UserError

if TYPE_CHECKING:
  import tensorflow_datasets as tfds

# Short name -> (module of paxlike.data, its builder class, default constructor kwargs).
DATASETS: dict[str, tuple[str, str, dict[str, Any]]] = {
    'stdlib': ('stdlib', 'Stdlib', {}),
    'shakespeare': ('shakespeare', 'Shakespeare', {}),
    'fashion_mnist': ('idx', 'IdxImages', {'config': 'fashion_mnist'}),
    'mnist': ('idx', 'IdxImages', {'config': 'mnist'}),
    'digits': ('digits', 'Digits', {}),
}


def builder_class(name: str) -> type[tfds.core.GeneratorBasedBuilder]:
  """The tfds builder class of dataset `name` (importing its module)."""
  if name not in DATASETS:
    raise UserError(f'unknown dataset {name!r}; known: {", ".join(sorted(DATASETS))}')
  module, cls, _ = DATASETS[name]
  return vars(importlib.import_module(f'paxlike.data.{module}'))[cls]


def _builder(name: str, data_dir: pathlib.Path, **kwargs: Any) -> tfds.core.GeneratorBasedBuilder:
  cls = builder_class(name)
  return cls(data_dir=str(data_dir), file_format='array_record',
             **{**DATASETS[name][2], **kwargs})


def declared_info(name: str) -> tfds.core.DatasetInfo:
  """Dataset `name`'s declared features and metadata: reads no source and prepares nothing."""
  return _builder(name, root.prepared_dir()).info


def source_fingerprint(name: str, **kwargs: Any) -> dict[str, str]:
  """{'dataset', 'source', 'sha256'} of dataset `name`'s current source files (see
  fingerprint.py); a missing source is a one-line UserError."""
  builder = _builder(name, root.prepared_dir(), **kwargs)
  return {'dataset': name, 'source': str(builder.source_location()),
          'sha256': fingerprint.digest(builder.source_files())}


def make_builder(name: str, **kwargs: Any) -> tfds.core.GeneratorBasedBuilder:
  """The builder of dataset `name`, writing to `prepared_dir()/<name>-<source fingerprint>`, so
  a changed source is prepared afresh; `kwargs` (e.g. `config`, `source_dir`, `source_file`)
  override the defaults."""
  key = f"{name}-{source_fingerprint(name, **kwargs)['sha256'][:16]}"
  return _builder(name, root.prepared_dir() / key, **kwargs)


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
  """Exclusive `flock` on `path` (created if needed) for the duration of the block."""
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, 'a') as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _is_complete(path: pathlib.Path) -> bool:
  # tfds writes into `incomplete.*` and renames, so the final directory is whole or absent.
  return (path / 'dataset_info.json').is_file()


def prepare(builder: tfds.core.DatasetBuilder) -> tfds.core.DatasetBuilder:
  """Prepares `builder` unless done (one process at a time), then returns a read-only
  builder over the prepared directory."""
  final = pathlib.Path(builder.data_dir)
  if not _is_complete(final):
    lock = final.parent.parent / f'.{final.parent.name}-{final.name}.lock'
    with _locked(lock):
      if not _is_complete(final):
        # Holding the lock, any incomplete dir of this variant is left by a killed process.
        for stale in final.parent.glob(f'incomplete.*_{final.name}'):
          shutil.rmtree(stale, ignore_errors=True)
        import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
        tfds.disable_progress_bar()
        # tfds prints "Downloading and preparing dataset Unknown size ..." to stdout, which is
        # wrong here (the files are local) and would break a missing file's one-line error.
        with contextlib.redirect_stdout(io.StringIO()):
          builder.download_and_prepare(download_dir=str(root.prepared_dir() / 'downloads'))
        sys.stderr.write(f'prepared {builder.name} from local files into {final}\n')
  return _from_directory(str(final))


def _from_directory(directory: str) -> tfds.core.DatasetBuilder:
  """A read-only builder over a prepared dataset directory."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  return tfds.builder_from_directory(directory)


def prepared(name: str, **kwargs: Any) -> str:
  """The directory of dataset `name` prepared from its current source (preparing it if needed)."""
  builder = make_builder(name, **kwargs)
  prepare(builder)
  return builder.data_dir


def read_split(directory: str, split: str) -> Sequence[dict[str, Any]]:
  """Random-access data source of `split` ('train' | 'test') of a prepared dataset directory."""
  return _split_of(_from_directory(directory), split)


def _split_of(ready: tfds.core.DatasetBuilder, split: str) -> Sequence[dict[str, Any]]:
  if split not in ready.info.splits:
    raise UserError(f'dataset {ready.name} has no split {split!r}; '
                    f'it has {", ".join(ready.info.splits)}')
  return ready.as_data_source(split=split)
