"""JAX's persistent compilation cache, on by default: a restarted or resumed job (and eval, decode
and export of it) loads its compiled programs instead of compiling them again.

`--compilation_cache_dir` picks the directory (default `$XDG_CACHE_HOME/paxlike/jax`, else
`~/.cache/paxlike/jax`; empty turns it off). That cache is bounded (least recently used entries
go first) and file-locked, so processes of several jobs can share it (where `filelock` is
missing, say a bare accelerator image, it is unbounded, as JAX makes it). JAX's own
`JAX_COMPILATION_CACHE_DIR` wins when set, and then the cache is JAX's as its variables set it
(unbounded unless `JAX_COMPILATION_CACHE_MAX_SIZE` says otherwise): a bound costs every write a
scan of the whole directory, which a cache of thousands of small programs, like the test
suite's, should not pay. paxlike's own cache keeps every compile that took at least
MIN_COMPILE_SECONDS (below JAX's default of 1 s, which would leave out a small model's decode
loop, compiled again by every warm `--mode=decode` run); an op run eagerly compiles in milliseconds and stays
out. `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS` wins when set.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import jax

MAX_BYTES = 4 << 30
MIN_COMPILE_SECONDS = 0.1


def default_dir() -> str:
  """The per-user cache directory."""
  root = os.environ.get('XDG_CACHE_HOME') or Path.home() / '.cache'
  return str(Path(root) / 'paxlike' / 'jax')


def configure(directory: str) -> str | None:
  """Points JAX's compilation cache at `directory` ('' = off), bounded and keeping compiles of
  MIN_COMPILE_SECONDS, unless JAX_COMPILATION_CACHE_DIR is set (then JAX's variables configure
  it); returns the directory in use, or None when the cache is off."""
  if jax_dir := os.environ.get('JAX_COMPILATION_CACHE_DIR'):
    jax.config.update('jax_compilation_cache_dir', jax_dir)
    return jax_dir
  if not directory:
    return None
  jax.config.update('jax_compilation_cache_dir', directory)
  if 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS' not in os.environ:
    jax.config.update('jax_persistent_cache_min_compile_time_secs', MIN_COMPILE_SECONDS)
  if importlib.util.find_spec('filelock') is not None:  # JAX needs it to bound the cache.
    jax.config.update('jax_compilation_cache_max_size', MAX_BYTES)
  return directory
