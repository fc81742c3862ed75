"""Prepares every real builder once per session into a temporary tfds dir."""

import pathlib

import pytest

from paxlike.data import prepare
from paxlike.data import root

REAL_DATASETS = ('digits', 'shakespeare', 'stdlib', 'fashion_mnist')


@pytest.fixture(scope='session')
def prepared_root(tmp_path_factory) -> pathlib.Path:
  """A tfds dir holding all four real datasets, built from their local sources."""
  path = tmp_path_factory.mktemp('tfds')
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
