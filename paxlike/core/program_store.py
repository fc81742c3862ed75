"""A run's traces and programs, kept on disk for the next run: a decode's abstract params and
exported prefill and loop (`Store.abstract_params`, `Store.traced`), and a training run's
compiled init, train step and eval step (`Store.compiled`).

JAX keeps no trace across processes, so without this store a warm `--mode=decode` run traces
the model three times (its init, for the params' shapes and shardings; the prefill; the loop)
only to find programs that JAX's persistent compilation cache serves. This store keeps what
those traces give: the params' shapes, dtypes and partition
specs (JSON), and the programs as `jax.export` serializations (StableHLO), which JAX lowers
and compiles (from its cache) without running the model's Python. An entry's key hashes
everything a trace reads: what the caller names (the model's attributes, the decode options,
the mesh and its rules), the arguments' tree, shapes, dtypes and shardings, the devices, the
jax, jaxlib and flax versions, every jax config value, the source of paxlike itself, the
installed libraries' versions and the size and mtime of every other loaded module's file
outside the standard library (a user's model class). A key that matches loads its entry; any
change misses, and the run traces and writes the entry. An entry that cannot be read
is traced again and overwritten; a program JAX cannot export (a custom call without a stable
target, say) runs as traced; a store that cannot be written (read-only, full) only warns.

A training run's programs are kept compiled (`jax.experimental.serialize_executable`, as
MaxText's ahead-of-time compiles are): a restart, or a run of a config traced before, then
neither traces nor lowers nor looks them up in JAX's cache, a cost that grows with the model
(docs/benchmarks.md, `startup.py --keep`). Their key adds what a compile reads besides the
program (XLA_FLAGS, LIBTPU_INIT_ARGS). A run of several processes compiles as before: each
process's executable is its own devices'. Only an executable XLA compiled in this process is
kept: XLA:CPU serializes one that JAX's cache loaded without its kernels. So a key that changes
(an edited experiment, another seed) while JAX's cache still holds its programs traces them and
loads them from that cache, until XLA compiles them again.

Each store lives beside JAX's compilation cache (DIRNAME for decode, TRAIN_DIRNAME for training,
inside it) and is on exactly when that cache is (`current`); each keeps its newest entries, up
to its count and bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import pickle
import sys
import sysconfig
import warnings
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
from jax.experimental import serialize_executable
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import paxlike
from paxlike.core import files as file_io

DIRNAME = 'paxlike-decode'
TRAIN_DIRNAME = 'paxlike-train'
MAX_ENTRIES = 64
# An entry's file; a '.tmp' one is being written.
SUFFIXES = ('.json', '.jaxexport', '.executable', '.pickle')
# What a compile reads besides its program, JAX's config and the devices.
COMPILER_ENV = ('XLA_FLAGS', 'LIBTPU_INIT_ARGS')


@functools.cache
def _source_digest() -> str:
  """sha256 of every paxlike source file's path and content: a code change is a new key."""
  root = Path(paxlike.__file__).parent
  digest = hashlib.sha256()
  for path in sorted(root.rglob('*.py')):
    digest.update(f'{path.relative_to(root)}\0'.encode() + path.read_bytes() + b'\0')
  return digest.hexdigest()


@functools.cache
def _installed() -> tuple[str, ...]:
  """The installed distributions' dist-info (egg-info) directory names, each a name and its
  version: an upgraded or added library is a new key, whichever modules a run imported."""
  names = set()
  for directory in {sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']}:
    with contextlib.suppress(OSError):
      names.update(n for n in os.listdir(directory) if n.endswith(('.dist-info', '.egg-info')))
  return tuple(sorted(names))


@functools.cache
def _loaded_code() -> tuple:
  """(path, size, mtime) of the file of every module loaded when this process first asks,
  outside the standard library, the installed libraries (`_installed`) and paxlike (its
  source is `_source_digest`): the user's experiments and models, whose edits then miss.
  Taken once per process, so that every key of a run sees the same set (a run that traces
  imports more than one that reads its traces; the libraries' modules a run imports differ
  more, with what it has to build)."""
  paths = sysconfig.get_paths()
  outside = (*{paths['stdlib'], paths['platstdlib'], paths['purelib'], paths['platlib']},
             str(Path(paxlike.__file__).parent))
  files = set()
  for module in list(sys.modules.values()):
    file = getattr(module, '__file__', None)
    if file and not file.startswith(outside):
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
  compiler = tuple(os.environ.get(name) for name in COMPILER_ENV)
  return (_source_digest(), _loaded_code(), _installed(), versions, config, devices,
          jax.process_count(), compiler)


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
  """Entries under `directory`, each a file named by its key: the `max_entries` newest, and of
  those only as many of the newest as fit in `max_bytes` (None: any size)."""

  directory: Path
  max_entries: int = MAX_ENTRIES
  max_bytes: int | None = None

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
    """Writes `path` whole (paxlike.core.files), then drops the oldest entries past
    the store's bounds. A store that cannot take it (read-only, full) is a warning: the run goes
    on with what it traced."""
    try:
      self.directory.mkdir(parents=True, exist_ok=True)
      file_io.write_bytes(path, blob)
    except OSError as error:
      warnings.warn(f'traces not kept in {self.directory}: {error}', stacklevel=3)
      return
    entries = []
    for entry in self.directory.iterdir():
      try:
        if entry.suffix in SUFFIXES:
          stat = entry.stat()
          entries.append((stat.st_mtime_ns, stat.st_size, entry))
      except FileNotFoundError:  # Dropped meanwhile by another process's write.
        continue
    kept = 0
    for count, (_, size, entry) in enumerate(sorted(entries, reverse=True)):
      kept += size
      if count >= self.max_entries or (self.max_bytes is not None and kept > self.max_bytes):
        with contextlib.suppress(OSError):
          entry.unlink(missing_ok=True)

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


  def value(self, parts: tuple, make: Callable[[], Any]) -> Any:
    """`make()`, or what it gave before under `parts` (kept pickled: shapes and boxes, no
    arrays); a value pickle cannot keep is made every time."""
    path = self._path(('value', parts), '.pickle')
    try:
      return pickle.loads(self._read(path))
    except Exception:  # pylint: disable=broad-except  Missing or unreadable: make it again.
      pass
    made = make()
    try:
      blob = pickle.dumps(made)
    except (TypeError, AttributeError, pickle.PicklingError):
      return made
    self._write(path, blob)
    return made

  def compiled(self, jitted: Any, args: tuple, parts: tuple, mesh: Mesh) -> Any:
    """`jitted.lower(*args).compile()` (a `jax.jit` of a function named as its program should
    be), or the executable that gave before under `parts` (what the function closes over) for
    these arguments, this mesh and these devices. Compiled anew, not kept, in a run of several
    processes, and for a program JAX cannot serialize (constants it hoisted as arguments, say)
    or whose trees cannot be pickled."""
    if jax.process_count() > 1:
      return jitted.lower(*args).compile()
    path = self._path(('compiled', parts, mesh_key(mesh), signature(args)), '.executable')
    try:
      devices = list(mesh.devices.flat)  # The program's device assignment, in its order.
      return serialize_executable.deserialize_and_load(
          *pickle.loads(self._read(path)), backend=devices[0].client, execution_devices=devices)
    except Exception:  # pylint: disable=broad-except  Missing or unreadable: compile it again.
      pass
    served = _cache_hits()
    before = served[0]
    compiled = jitted.lower(*args).compile()
    if served[0] > before:  # JAX's cache served it: XLA:CPU cannot serialize what it loaded.
      return compiled
    try:
      blob = pickle.dumps(serialize_executable.serialize(compiled))
    except (ValueError, NotImplementedError, TypeError, AttributeError, pickle.PicklingError):
      return compiled
    self._write(path, blob)
    return compiled


@functools.cache
def _cache_hits() -> list[int]:
  """A count of the programs JAX's compilation cache has served this process since first
  asked."""
  count = [0]

  def counted(event: str, **_: Any) -> None:
    if event == '/jax/compilation_cache/cache_hits':
      count[0] += 1
  jax.monitoring.register_event_listener(counted)
  return count


TRAIN_BOUNDS = {'max_entries': 1024, 'max_bytes': 1 << 30}  # Executables: a large model's are big.


def at(cache_dir: str | None, dirname: str = DIRNAME) -> Store | None:
  """The store `dirname` (DIRNAME: decode's; TRAIN_DIRNAME: training's) inside compilation
  cache directory `cache_dir`; None where there is none (the cache off) or it is not a local
  directory."""
  if not cache_dir or '://' in cache_dir:
    return None
  return Store(Path(cache_dir) / dirname, **(TRAIN_BOUNDS if dirname == TRAIN_DIRNAME else {}))


def current(dirname: str = DIRNAME) -> Store | None:
  """The store `dirname` of the compilation cache this process uses (`at`)."""
  return at(jax.config.jax_compilation_cache_dir, dirname)
