"""A token store damaged on disk (cut short, ids overwritten in place) is found when it is
opened and rebuilt, never fed to the model; an unusable token dir is one line."""

import json
import os
import time
import zlib

import numpy as np
import pytest

from paxlike.data import store_check, text_files, token_store
from paxlike.errors import UserError
from paxlike.tokenizers import BytesTokenizer

F = text_files.Fields


class CountingBytes(BytesTokenizer):
  calls = 0

  def encode_flat(self, texts, num_threads=None):
    type(self).calls += 1
    return super().encode_flat(texts, num_threads)


@pytest.fixture
def store_files(tmp_path, monkeypatch):
  monkeypatch.setenv(token_store.TOKEN_DIR_ENV, str(tmp_path / 'tokens'))
  path = tmp_path / 'c.jsonl'
  path.write_text(''.join(json.dumps({'text': f'document number {i} ' * (i % 5 + 1)}) + '\n'
                          for i in range(40)))
  return text_files.expand(str(path))


def tokens_of(store):
  return np.concatenate([np.asarray(s) for s in store.shards])


def test_the_manifest_records_each_file_s_size_and_crc32(store_files):
  store = token_store.open_or_build(store_files, F(), BytesTokenizer(), 1)
  sums = store.manifest['checksums']
  assert set(sums) >= {'tokens-00000.bin', 'doc_start.bin', 'doc_hash.bin'}
  for name, crc in sums.items():  # Running CRCs equal the files' own, computed afresh.
    assert crc == f'{zlib.crc32((store.path / name).read_bytes()):08x}'


@pytest.mark.parametrize('damage', ['truncated', 'overwritten'])
def test_a_damaged_store_is_rebuilt_with_a_warning(store_files, capsys, damage):
  store = token_store.open_or_build(store_files, F(), BytesTokenizer(), 1)
  want = tokens_of(store).copy()
  shard = store.path / 'tokens-00000.bin'
  if damage == 'truncated':
    os.truncate(shard, shard.stat().st_size // 2)
  else:  # Same size, ids outside the vocabulary (later than the mtime's granularity).
    time.sleep(0.05)
    ids = np.fromfile(shard, want.dtype)
    ids[::7] = 60_000
    ids.tofile(shard)
  capsys.readouterr()
  CountingBytes.calls = 0
  again = token_store.open_or_build(store_files, F(), CountingBytes(), 1)
  err = capsys.readouterr().err
  assert f'warning: token store {store.path} is damaged (tokens-00000.bin ' in err
  assert ('has' if damage == 'truncated' else 'changed since its build') in err
  assert CountingBytes.calls == 1 and np.array_equal(tokens_of(again), want)
  CountingBytes.calls = 0
  token_store.open_or_build(store_files, F(), CountingBytes(), 1)  # Whole again: just opened.
  assert CountingBytes.calls == 0 and 'damaged' not in capsys.readouterr().err


def test_an_untouched_store_is_read_for_its_checksums_once(store_files, monkeypatch):
  store = token_store.open_or_build(store_files, F(), BytesTokenizer(), 1)
  token_store.Store.open(store.path)  # Verified (by the first open) and recorded.
  read = []
  monkeypatch.setattr(store_check, '_crc_of', lambda path: read.append(path) or '0')
  token_store.Store.open(store.path)
  assert read == []


def test_a_token_dir_that_cannot_be_made_is_one_user_error(store_files, tmp_path, monkeypatch):
  (tmp_path / 'a_file').write_text('x')
  monkeypatch.setenv(token_store.TOKEN_DIR_ENV, str(tmp_path / 'a_file' / 'tokens'))
  with pytest.raises(UserError, match=r'token store dir .*a_file/tokens \(\$PAXLIKE_TOKEN_DIR\) '
                                      r'cannot be created \(Not a directory\)'):
    token_store.open_or_build(store_files, F(), BytesTokenizer(), 1)
