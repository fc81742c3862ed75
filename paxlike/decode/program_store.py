"""A decode run's traces, kept on disk for the next run: the model's abstract params and the
exported prefill and loop.

After its imports, a warm `--mode=decode` run spent most of its time tracing the model three
times (its init, for the params' shapes and shardings; the prefill; the loop), only to find
programs that JAX's persistent compilation cache then served: JAX keeps no trace across
processes. This store keeps what those traces give: the params' shapes, dtypes and partition
specs (JSON), and the programs as `jax.export` serializations (StableHLO), which JAX lowers
and compiles (from its cache) without running the model's Python. An entry's key hashes
everything a trace reads: what the caller names (the model's attributes, the decode options,
the mesh and its rules), the arguments' tree, shapes, dtypes and shardings, the devices, the
jax, jaxlib and flax versions, every jax config value, the source of paxlike itself and the
size and mtime of every other loaded module's file outside the standard library (a user's
model class, an upgraded library). A key that matches loads its entry; any change misses,
and the run traces as before and writes the entry. An entry that cannot be read is traced
again and overwritten; a program JAX cannot export (a custom call without a stable target,
say) runs as traced; a store that cannot be written (read-only, full) only warns.

It lives beside JAX's compilation cache (`DIRNAME` inside it) and is on exactly when that
cache is (`current`); it keeps the MAX_ENTRIES newest entries.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import sys
import sysconfig
import warnings
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import paxlike

DIRNAME = 'paxlike-decode'
MAX_ENTRIES = 64
SUFFIXES = ('.json', '.jaxexport')  # An entry's file; a '.tmp' one is being written.


@functools.cache
def _source_digest() -> str:
  """sha256 of every paxlike source file's path and content: a code change is a new key."""
  root = Path(paxlike.__file__).parent
  digest = hashlib.sha256()
  for path in sorted(root.rglob('*.py')):
    digest.update(f'{path.relative_to(root)}\0'.encode() + path.read_bytes() + b'\0')
  return digest.hexdigest()


@functools.cache
def _loaded_code() -> tuple:
  """(path, size, mtime) of the file of every module loaded when this process first asks, the
  standard library's aside: the user's experiments and models and every installed library,
  whose edits or upgrades then miss. Taken once per process, so that every key of a run sees
  the same set (a run that traces imports more than one that reads its traces)."""
  paths = sysconfig.get_paths()
  stdlib = tuple({paths['stdlib'], paths['platstdlib']} - {paths['purelib'], paths['platlib']})
  libraries = (paths['purelib'], paths['platlib'])
  files = set()
  for module in list(sys.modules.values()):
    file = getattr(module, '__file__', None)
    if file and (not file.startswith(stdlib) or file.startswith(libraries)):
      files.add(file)
  stats = []
  for file in sorted(files):
    try:
      stat = os.stat(file)
    except OSError:
      continue
    stats.append((file, stat.st_size, stat.st_mtime_ns))
  return tuple(stats)


def _environment() -> tuple:
  """What a trace reads besides its arguments and what the caller names."""
  versions = tuple(importlib.metadata.version(p) for p in ('jax', 'jaxlib', 'flax'))
  config = tuple(sorted((name, repr(value)) for name, value in jax.config.values.items()))
  devices = tuple((d.platform, d.device_kind, d.id) for d in jax.devices())
  return (_source_digest(), _loaded_code(), versions, config, devices, jax.process_count())


def mesh_key(mesh: Mesh | None) -> tuple | None:
  """A mesh as a key: its axis names, shape and device ids in order."""
  if mesh is None:
    return None
  return mesh.axis_names, mesh.devices.shape, tuple(d.id for d in mesh.devices.flat)


def signature(args: Any) -> tuple:
  """The arguments' tree, and each leaf's shape, dtype, weak type and sharding."""
  def leaf(x: Any) -> tuple:
    return repr(jax.typeof(x)), repr(x.sharding) if isinstance(x, jax.Array) else None
  leaves, tree = jax.tree.flatten(args)
  return str(tree), tuple(map(leaf, leaves))


@dataclasses.dataclass(frozen=True)
class Store:
  """Entries under `directory`, each a file named by its key."""

  directory: Path

  def _path(self, parts: tuple, suffix: str) -> Path:
    key = hashlib.sha256(repr((parts, _environment())).encode()).hexdigest()
    return self.directory / f'{key[:40]}{suffix}'

  def _read(self, path: Path) -> bytes:
    """The entry at `path`, marked used where the store may be written (its mtime: the newest
    entries are kept); OSError when there is none."""
    blob = path.read_bytes()
    with contextlib.suppress(OSError):  # A store this process may only read.
      os.utime(path)
    return blob

  def _write(self, path: Path, blob: bytes) -> None:
    """Writes `path` whole (a temporary file renamed), then drops the oldest entries past
    MAX_ENTRIES. A store that cannot take it (read-only, full) is a warning: the run goes on
    with what it traced."""
    tmp = path.with_name(f'.{path.name}.{os.getpid()}.tmp')
    try:
      self.directory.mkdir(parents=True, exist_ok=True)
      tmp.write_bytes(blob)
      os.replace(tmp, path)
    except OSError as error:
      with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)
      warnings.warn(f'decode traces not kept in {self.directory}: {error}', stacklevel=3)
      return
    entries = []
    for entry in self.directory.iterdir():
      try:
        if entry.suffix in SUFFIXES:
          entries.append((entry.stat().st_mtime_ns, entry))
      except FileNotFoundError:  # Dropped meanwhile by another process's write.
        continue
    for _, old in sorted(entries, reverse=True)[MAX_ENTRIES:]:
      with contextlib.suppress(OSError):
        old.unlink(missing_ok=True)

  def abstract_params(self, parts: tuple, mesh: Mesh, make: Callable[[], Any]) -> Any:
    """`make()` (the params as sharded ShapeDtypeStructs on `mesh`, each NamedSharding'd), or
    the entry it gave before under `parts` (what determines it besides the environment)."""
    from flax import traverse_util  # pylint: disable=import-outside-toplevel
    path = self._path(('abstract_params', parts, mesh_key(mesh)), '.json')
    try:
      leaves = json.loads(self._read(path))
      return traverse_util.unflatten_dict({
          tuple(names): jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype), sharding=NamedSharding(
              mesh, PartitionSpec(*(tuple(a) if isinstance(a, list) else a for a in spec))))
          for names, shape, dtype, spec in leaves})
    except (OSError, ValueError, TypeError, KeyError):
      pass
    made = make()
    flat = traverse_util.flatten_dict(made)
    if all(isinstance(s.sharding, NamedSharding) for s in flat.values()):
      self._write(path, json.dumps([
          [list(names), list(s.shape), s.dtype.name, list(s.sharding.spec)]
          for names, s in flat.items()]).encode())
    return made

  def traced(self, jitted: Any, parts: tuple, mesh: Mesh | None,
             donate_argnums: tuple[int, ...] = ()) -> Callable[..., Any]:
    """`jitted` (a `jax.jit` of a function named as its programs should be), its trace for each
    argument signature read from the entry under `parts` (what the function closes over) and
    that signature, else traced (in the caller's mesh context) and written there."""
    runs: dict[tuple, Callable[..., Any]] = {}

    def call(*args: Any) -> Any:
      key = signature(args)
      if key not in runs:
        runs[key] = self._exported_or_traced(jitted, args, (parts, mesh_key(mesh), key),
                                             donate_argnums)
      return runs[key](*args)
    return call

  def _exported_or_traced(self, jitted: Any, args: tuple, parts: tuple,
                          donate_argnums: tuple[int, ...]) -> Callable[..., Any]:
    path = self._path(('exported', parts), '.jaxexport')
    try:
      exported = jax.export.deserialize(bytearray(self._read(path)))
    except Exception:  # pylint: disable=broad-except  Missing or unreadable: trace it again.
      try:
        exported = jax.export.export(jitted)(*args)
      except (ValueError, TypeError, NotImplementedError):  # Not exportable: run as traced.
        return jitted
      self._write(path, exported.serialize())

    def run(*args: Any) -> Any:
      return exported.call(*args)
    run.__name__ = getattr(jitted, '__name__', 'run')  # JAX names the program after it.
    return jax.jit(run, donate_argnums=donate_argnums)


def at(cache_dir: str | None) -> Store | None:
  """The store inside compilation cache directory `cache_dir`; None where there is none (the
  cache off) or it is not a local directory."""
  if not cache_dir or '://' in cache_dir:
    return None
  return Store(Path(cache_dir) / DIRNAME)


def current() -> Store | None:
  """The store of the compilation cache this process uses (`at`)."""
  return at(jax.config.jax_compilation_cache_dir)
