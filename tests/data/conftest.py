"""Prepares every real builder once per session into a temporary tfds dir, from the suite's
data root."""

import os
import pathlib

import pytest

from paxlike.data import prepare
from paxlike.data import root

REAL_DATASETS = ('digits', 'shakespeare', 'stdlib', 'fashion_mnist')


@pytest.fixture(scope='session')
def prepared_root(tmp_path_factory, suite_data_root) -> pathlib.Path:
  """A tfds dir holding all four real builders' datasets, built from the suite's data root
  (tests/fixture_data.py) and the local digits and stdlib.

  pytest-xdist workers share one dir (the run's common temp parent): the first to take
  the preparation lock builds, the others wait and reuse it.
  """
  if 'PYTEST_XDIST_WORKER' not in os.environ:
    path = tmp_path_factory.mktemp('tfds')
  else:
    path = tmp_path_factory.getbasetemp().parent / 'paxlike-tfds'
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv(root.TFDS_DIR_ENV, str(path))
    for name in REAL_DATASETS:
      prepare.prepare(prepare.make_builder(name))
  return path


@pytest.fixture
def prepared(prepared_root, monkeypatch) -> pathlib.Path:
  """Points $PAXLIKE_TFDS_DIR at the session's prepared data for one test."""
  monkeypatch.setenv(root.TFDS_DIR_ENV, str(prepared_root))
  return prepared_root
