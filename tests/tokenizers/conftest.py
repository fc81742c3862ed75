"""Tiny tokenizers trained once per session on the first 50 KB of the suite's Tiny Shakespeare
slice (tests/fixture_data.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from paxlike.tokenizers import train
from tests.fixture_data import SHAKESPEARE_SLICE

REPO = Path(__file__).resolve().parents[2]
VOCAB = 400


@pytest.fixture(scope='session')
def corpus_text() -> str:
  return SHAKESPEARE_SLICE.read_text('utf-8')[:50_000]


@pytest.fixture(scope='session')
def corpus_file(tmp_path_factory, corpus_text) -> Path:
  path = tmp_path_factory.mktemp('corpus') / 'shakespeare.txt'
  path.write_text(corpus_text, 'utf-8')
  return path


@pytest.fixture(scope='session')
def tokenizer_dirs(tmp_path_factory, corpus_text) -> dict[str, Path]:
  """kind ('sentencepiece', 'hf') -> a directory holding a VOCAB-id tokenizer of that kind."""
  dirs = {}
  for kind, train_kind in (('sentencepiece', 'sentencepiece'), ('hf', 'bpe')):
    dirs[kind] = tmp_path_factory.mktemp(kind)
    train.write_tokenizer(train_kind, [corpus_text], VOCAB, dirs[kind])
  return dirs
