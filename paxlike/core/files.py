"""The one way paxlike writes a file or a directory that readers must see whole or not at all.

A file is written to a temporary file of a unique name beside it (`.NAME.PID-RANDOM.tmp`),
fsynced, renamed over `path` with `os.replace`, and then the directory is fsynced, so that after
a crash or a kill at any point the path holds the old content or the new, never a part, and the
rename itself survives a power cut. A write that fails removes its temporary file. A directory is
written the same way: into a fresh temporary directory beside it (`.tmp-NAME-...`), whose files
are fsynced before it is renamed into place."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

# Directory fsync is not supported everywhere (some network and FUSE file systems); the rename
# is then as durable as that file system makes it.
_NO_DIR_SYNC = (errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EISDIR, errno.EACCES)


def sync_dir(directory: str | os.PathLike) -> None:
  """fsyncs `directory`, so that a rename or creation in it is on disk."""
  try:
    fd = os.open(directory, os.O_RDONLY | getattr(os, 'O_DIRECTORY', 0))
  except OSError as error:
    if error.errno in _NO_DIR_SYNC:
      return
    raise
  try:
    os.fsync(fd)
  except OSError as error:
    if error.errno not in _NO_DIR_SYNC:
      raise
  finally:
    os.close(fd)


def _temp_file(path: Path, mode: int) -> tuple[Path, int]:
  """A new temporary file beside `path` (created exclusively, `mode` less the umask)."""
  while True:
    temp = path.with_name(f'.{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp')
    try:
      return temp, os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
      continue


@contextlib.contextmanager
def open_atomic(path: str | os.PathLike, binary: bool = False, mode: int = 0o666,
                encoding: str = 'utf-8') -> Iterator[IO[Any]]:
  """A file to write `path`'s new content into; it replaces `path` when the block ends without
  an exception (fsynced, renamed, directory fsynced), and is removed when it raises. `mode` is
  the new file's permissions before the umask, as for `open` (0o600: the owner's alone)."""
  path = Path(path)
  temp, fd = _temp_file(path, mode)
  try:
    with os.fdopen(fd, 'wb' if binary else 'w', **({} if binary else {'encoding': encoding})
                   ) as file:
      yield file
      file.flush()
      os.fsync(file.fileno())
    os.replace(temp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      temp.unlink()
    raise
  sync_dir(path.parent)


def write_bytes(path: str | os.PathLike, data: bytes, mode: int = 0o666) -> Path:
  """Writes `data` to `path` whole (see `open_atomic`); the path."""
  with open_atomic(path, binary=True, mode=mode) as file:
    file.write(data)
  return Path(path)


def write_text(path: str | os.PathLike, text: str, mode: int = 0o666,
               encoding: str = 'utf-8') -> Path:
  """Writes `text` to `path` whole (see `open_atomic`); the path."""
  with open_atomic(path, mode=mode, encoding=encoding) as file:
    file.write(text)
  return Path(path)


def write_json(path: str | os.PathLike, value: Any, **dumps: Any) -> Path:
  """Writes `value` as JSON and a newline to `path` whole; `dumps`: json.dumps's options
  (indent=2 unless given)."""
  return write_text(path, json.dumps(value, **{'indent': 2, **dumps}) + '\n')


def copy_file(source: str | os.PathLike, path: str | os.PathLike) -> Path:
  """Copies the file `source` to `path`, which appears whole (see `open_atomic`)."""
  with open(source, 'rb') as src, open_atomic(path, binary=True) as dst:
    shutil.copyfileobj(src, dst)
  return Path(path)


def _temp_dir(final: Path) -> Path:
  """A new empty directory beside `final` (permissions as `mkdir` gives them)."""
  while True:
    temp = final.with_name(f'.tmp-{final.name}-{os.getpid()}-{secrets.token_hex(4)}')
    try:
      temp.mkdir()
      return temp
    except FileExistsError:
      continue


def _sync_tree(root: Path) -> None:
  """fsyncs every file and directory under `root`, and `root` itself (links are left)."""
  for directory, _, names in os.walk(root):
    for name in names:
      if os.path.islink(os.path.join(directory, name)):
        continue
      fd = os.open(os.path.join(directory, name), os.O_RDONLY)
      try:
        os.fsync(fd)
      finally:
        os.close(fd)
    sync_dir(directory)


@contextlib.contextmanager
def dir_written(final: str | os.PathLike) -> Iterator[Path]:
  """A fresh temporary directory beside `final` (`.tmp-NAME-PID-...`, parents made) to write
  into; when the block ends without an exception its files are fsynced and it is renamed to
  `final` (which must be absent or an empty directory by then: OSError otherwise) and the parent
  fsynced. On any exception, the rename's included, the temporary directory is removed."""
  final = Path(final)
  final.parent.mkdir(parents=True, exist_ok=True)
  temp = _temp_dir(final)
  try:
    yield temp
    _sync_tree(temp)
    os.replace(temp, final)
  except BaseException:
    shutil.rmtree(temp, ignore_errors=True)
    raise
  sync_dir(final.parent)
