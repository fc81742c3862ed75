"""tests/tpu: checks that need a TPU, marked `tpu` and skipped without one (CI has none).

Run them on a TPU machine (one program at a time holds the chip: no -n):

    python -m benchmarks.tpu_tests     # or: python -m pytest tests/tpu --confcutdir=tests/tpu

benchmarks/device_check.sh runs them as its `tpu_tests` part. Whether there is a TPU is asked
without starting JAX's backends where it can be (no libtpu, or JAX_PLATFORMS without tpu), so the
CPU suite never starts a backend at collection for these.
"""

import functools
import glob
import importlib.util
import os

import pytest

MARKER = 'tpu: needs a TPU (tests/tpu); skipped without one'


def pytest_configure(config: pytest.Config) -> None:
  config.addinivalue_line('markers', MARKER)


@functools.lru_cache(maxsize=None)
def tpu_missing() -> str | None:
  """Why there is no TPU here, or None when there is one."""
  platforms = os.environ.get('JAX_PLATFORMS', '')
  if platforms and 'tpu' not in platforms.split(','):
    return f'JAX_PLATFORMS={platforms}'
  if not (importlib.util.find_spec('libtpu') or glob.glob('/dev/accel*')
          or glob.glob('/dev/vfio/[0-9]*')):
    return 'no libtpu and no TPU device file'
  import jax
  try:
    return None if jax.devices('tpu') else 'no TPU device'
  except RuntimeError as error:
    return f'no TPU backend: {str(error).splitlines()[0][:120]}'


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
  marked = [item for item in items if item.get_closest_marker('tpu')]
  if marked and tpu_missing():
    skip = pytest.mark.skip(reason=f'needs a TPU ({tpu_missing()})')
    for item in marked:
      item.add_marker(skip)
