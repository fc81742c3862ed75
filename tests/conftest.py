"""Suite-wide settings. Before anything imports jax: one persistent compilation cache shared by
the test processes and every CLI they start (tests.helpers.cli_env copies os.environ), keeping
even the tiny models' sub-second compiles, so each distinct program compiles once per machine.
Then the data every test reads: a data root made from the repository's own files
(suite_data_root), and the real one for the few tests marked full_data (_full_data)."""

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

# What the user's environment names as the data root, read before the suite points it at its own.
_USER_DATA_DIR = os.environ.get('PAXLIKE_DATA_DIR')

import pathlib  # noqa: E402 (after the settings above, like every import that may load jax)

import pytest  # noqa: E402

from tests import fixture_data  # noqa: E402
from tests.helpers import made_once  # noqa: E402


def pytest_addoption(parser: pytest.Parser) -> None:
  parser.addoption('--require-full-data', action='store_true',
                   help='fail full_data tests whose data sets are absent, instead of skipping them')


def full_data_root() -> pathlib.Path | None:
  """The data root the real experiments read in this environment (paxlike.data.root's
  resolution, under the environment the suite started with); None if the one named does not
  exist."""
  from paxlike.data import root
  from paxlike.errors import UserError
  with pytest.MonkeyPatch.context() as mp:
    if _USER_DATA_DIR is None:
      mp.delenv(root.DATA_DIR_ENV, raising=False)
    else:
      mp.setenv(root.DATA_DIR_ENV, _USER_DATA_DIR)
    try:
      return root.data_root()
    except UserError:
      return None


@pytest.fixture(scope='session', autouse=True)
def suite_data_root(tmp_path_factory) -> pathlib.Path:
  """$PAXLIKE_DATA_DIR, for the whole session and every CLI it starts, points at a data root
  made from the repository's own files (tests/fixture_data.py), so the suite passes on a fresh
  clone with nothing beside it."""
  path = made_once(tmp_path_factory, 'data_root', fixture_data.build_data_root)
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv('PAXLIKE_DATA_DIR', str(path))
    yield path


@pytest.fixture(autouse=True)
def _full_data(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
  """A test marked full_data reads the real data root; it is skipped, saying what is missing
  and where, when that root lacks the full data sets (failed under --require-full-data)."""
  if request.node.get_closest_marker('full_data') is None:
    return
  real = full_data_root()
  if missing := fixture_data.missing_full_data(real):
    reason = (f'full data sets absent: the data root {real or _USER_DATA_DIR} lacks '
              f'{len(missing)} of their {len(fixture_data.FULL_DATA_FILES)} files, e.g. '
              f'{missing[0]} (README.md, "Data for the full experiments")')
    if request.config.getoption('--require-full-data'):
      pytest.fail(reason)
    pytest.skip(reason)
  monkeypatch.setenv('PAXLIKE_DATA_DIR', str(real))
