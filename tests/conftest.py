"""Suite-wide settings, before anything imports jax: one persistent compilation cache shared by
the test processes and every CLI they start (tests.helpers.cli_env copies os.environ), keeping
even the tiny models' sub-second compiles, so each distinct program compiles once per machine."""

import os
import tempfile

os.environ.setdefault('JAX_COMPILATION_CACHE_DIR',
                      os.path.join(tempfile.gettempdir(), f'paxlike-tests-jax-cache-{os.getuid()}'))
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
