"""Suite-wide settings, before anything imports jax: one persistent compilation cache shared by
the test processes and every CLI they start (tests.helpers.cli_env copies os.environ), keeping
even the tiny models' sub-second compiles, so each distinct program compiles once per machine."""

import os
import tempfile

os.environ.setdefault('JAX_COMPILATION_CACHE_DIR',
                      os.path.join(tempfile.gettempdir(), f'paxlike-tests-jax-cache-{os.getuid()}'))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
# The suite compiles hundreds of small programs and runs few steps of each: LLVM at -O0 compiles
# them ~35% faster (suite: 715 -> 603 s on 2 cores). Results differ from -O2 at round-off only
# (e.g. where LLVM fuses multiply-adds), and each test compares runs made under the same flag;
# tests.helpers.cli_env(optimized=True) keeps the production level for the long training runs.
_flags = os.environ.get('XLA_FLAGS', '')
if '--xla_backend_optimization_level' not in _flags:
  os.environ['XLA_FLAGS'] = f'{_flags} --xla_backend_optimization_level=0'.strip()
