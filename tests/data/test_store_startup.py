"""A start on an existing token store reads no corpus byte: each file's content hash comes from
the token dir's index while its stat is unchanged (file_hashes.py); a changed file alone is
hashed again, and --verify_data ($PAXLIKE_VERIFY_DATA) reads everything again."""

import json
import os
import sys
import time

import numpy as np
import pytest

from paxlike.data import TextData
from paxlike.data import file_hashes
from paxlike.data import fingerprint
from paxlike.data import store_check
from paxlike.data import text_files
from paxlike.data import token_store
from paxlike.tokenizers import BytesTokenizer
from tests.helpers import run_module

F = text_files.Fields
WATCHED: set[str] = set()  # Corpus paths whose opens OPENED records (one hook per process).
OPENED: list[str] = []


def _record_opens(event: str, args: tuple) -> None:
  if event == 'open' and WATCHED and isinstance(args[0], (str, bytes, os.PathLike)):
    path = os.path.abspath(os.fsdecode(args[0]))
    if path in WATCHED:
      OPENED.append(path)


sys.addaudithook(_record_opens)


class CountingBytes(BytesTokenizer):
  """The byte tokenizer, counting its encode calls (a build's)."""

  calls = 0

  def encode_flat(self, texts, num_threads=None):
    type(self).calls += 1
    return super().encode_flat(texts, num_threads)


@pytest.fixture(autouse=True)
def token_dir(tmp_path, monkeypatch):
  monkeypatch.setenv(token_store.TOKEN_DIR_ENV, str(tmp_path / 'tokens'))
  monkeypatch.delenv(token_store.VERIFY_ENV, raising=False)
  yield tmp_path / 'tokens'
  WATCHED.clear()
  OPENED.clear()


@pytest.fixture
def hashed(monkeypatch):
  """The files fingerprint.file_sha256 reads (the only reader of corpus bytes for the key)."""
  paths = []
  read = fingerprint.file_sha256
  monkeypatch.setattr(fingerprint, 'file_sha256', lambda path: paths.append(path) or read(path))
  return paths


def write_corpus(directory, texts=('alpha beta gamma', 'delta epsilon zeta eta')):
  """Two .txt files (a document each), their times an hour back."""
  directory.mkdir(exist_ok=True)
  for i, text in enumerate(texts):
    set_text(directory / f'f{i}.txt', text, time.time() - 3600)
  return text_files.expand(str(directory / '*.txt'))


def set_text(path, text, mtime):
  path.write_text(text)
  os.utime(path, (mtime, mtime))


def test_a_start_on_an_existing_store_opens_no_corpus_file(tmp_path, monkeypatch, hashed):
  monkeypatch.setattr(file_hashes, 'RACY_NS', 0)  # Hashed in the tick it was written: trusted.
  files = write_corpus(tmp_path / 'corpus')
  CountingBytes.calls = 0
  built = token_store.open_or_build(files, F(), CountingBytes(), 1)
  assert sorted(hashed) == sorted(files.values()) and CountingBytes.calls == 1
  WATCHED.update(str(p) for p in files.values())
  hashed.clear()
  again = token_store.open_or_build(files, F(), CountingBytes(), 1)
  data = TextData(files=str(tmp_path / 'corpus' / '*.txt'))
  record = data.fingerprint()  # The job dir's record: the store's key.
  assert OPENED == [] and hashed == [] and CountingBytes.calls == 1
  assert again.path == built.path == data.store.path
  # The same key as a full read of the files gives (what every start computed before).
  assert record['sha256'] == built.manifest['key'] == token_store.store_key(
      files, F(), BytesTokenizer(), verify=True)
  assert OPENED  # The full read opened them: the hook sees this process's opens.


def test_a_changed_file_alone_is_hashed_again_and_gets_a_new_store(tmp_path, monkeypatch,
                                                                    hashed):
  monkeypatch.setattr(file_hashes, 'RACY_NS', 0)
  files = write_corpus(tmp_path / 'corpus')
  old = token_store.open_or_build(files, F(), BytesTokenizer(), 1)
  changed = files['f0.txt']
  set_text(changed, 'ALPHA BETA GAMMA', time.time() - 1800)  # Same size, another mtime.
  hashed.clear()
  CountingBytes.calls = 0
  new = token_store.open_or_build(files, F(), CountingBytes(), 1)
  assert hashed == [changed] and CountingBytes.calls == 1 and new.path != old.path
  assert bytes(new.tokens_at(np.arange(16)).astype(np.uint8)) == b'ALPHA BETA GAMMA'
  assert new.manifest['key'] == token_store.store_key(files, F(), BytesTokenizer(), verify=True)


def test_a_file_hashed_in_the_tick_it_was_written_is_hashed_again(tmp_path, hashed):
  files = write_corpus(tmp_path / 'corpus')  # ctime: now, within RACY_NS of the hashing.
  token_store.open_or_build(files, F(), BytesTokenizer(), 1)
  hashed.clear()
  token_store.open_or_build(files, F(), BytesTokenizer(), 1)
  assert sorted(hashed) == sorted(files.values())


def test_verify_data_hashes_every_file_and_builds_the_store_of_what_it_reads(
    tmp_path, monkeypatch, hashed, token_dir, capsys):
  monkeypatch.setattr(file_hashes, 'RACY_NS', 0)
  files = write_corpus(tmp_path / 'corpus')
  old = token_store.open_or_build(files, F(), BytesTokenizer(), 1)
  # A rewrite the stat does not show (as in one timestamp tick): the index's entry is given
  # the new stat, hashed after it, with the old content's hash.
  path = files['f1.txt']
  set_text(path, 'DELTA EPSILON ZETA ETA', time.time() - 1800)
  index = token_dir / file_hashes.INDEX
  entries = json.loads(index.read_text())
  entries[str(path)][:6] = [*file_hashes.stat_key(path), time.time_ns()]
  index.write_text(json.dumps(entries))
  hashed.clear()
  assert token_store.open_or_build(files, F(), BytesTokenizer(), 1).path == old.path  # Trusted.
  assert hashed == []
  monkeypatch.setenv(token_store.VERIFY_ENV, '1')  # What --verify_data sets.
  new = token_store.open_or_build(files, F(), BytesTokenizer(), 1)
  assert sorted(hashed) == sorted(files.values()) and new.path != old.path
  assert 'changed without a change to its size or times' in capsys.readouterr().err
  monkeypatch.delenv(token_store.VERIFY_ENV)
  hashed.clear()
  assert token_store.open_or_build(files, F(), BytesTokenizer(), 1).path == new.path
  assert hashed == []  # The index now holds what was read.


def test_verify_data_reads_the_stores_checksums_again(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(file_hashes, 'RACY_NS', 0)
  files = write_corpus(tmp_path / 'corpus')
  store = token_store.open_or_build(files, F(), BytesTokenizer(), 1)
  capsys.readouterr()
  tokens = store.path / 'tokens-00000.bin'
  stat = tokens.stat()
  tokens.write_bytes(b'X' * stat.st_size)  # Overwritten in place, its times put back.
  os.utime(tokens, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  token_store.open_or_build(files, F(), BytesTokenizer(), 1)  # Size and times: as verified.
  assert capsys.readouterr().err == ''
  rebuilt = token_store.open_or_build(files, F(), BytesTokenizer(), 1, verify=True)
  assert f'token store {store.path} is damaged' in capsys.readouterr().err
  assert bytes(rebuilt.tokens_at(np.arange(5)).astype(np.uint8)) == b'alpha'
  assert (rebuilt.path / store_check.VERIFIED).is_file()


def test_entries_of_other_processes_are_kept_and_a_torn_index_is_rebuilt(tmp_path, token_dir,
                                                                         hashed):
  index = token_dir / file_hashes.INDEX
  token_dir.mkdir()
  file_hashes.record(index, {'/elsewhere/x.txt': [1, 2, 3, 4, 5, 6, 'ab']})
  files = write_corpus(tmp_path / 'corpus')
  token_store.open_or_build(files, F(), BytesTokenizer(), 1)
  entries = file_hashes.read_index(index)
  assert set(entries) == {'/elsewhere/x.txt', *map(str, files.values())}
  index.write_text('{"torn')
  assert file_hashes.read_index(index) == {}
  hashed.clear()
  token_store.open_or_build(files, F(), BytesTokenizer(), 1)
  assert len(hashed) == 2 and set(file_hashes.read_index(index)) == set(map(str, files.values()))


def test_the_verify_data_flag_asks_every_process_for_a_full_check(monkeypatch):
  from paxlike import main
  from paxlike.trainer import compile_cache
  monkeypatch.setattr(compile_cache, 'configure', lambda directory: None)
  monkeypatch.setenv(token_store.VERIFY_ENV, '0')  # Restored after the test.
  assert not token_store.verify_requested()
  main.FLAGS.unparse_flags()
  try:
    main.FLAGS(['paxlike', '--verify_data'])
    main.use_local_settings()
  finally:
    main.FLAGS.unparse_flags()
  assert token_store.verify_requested() and os.environ[token_store.VERIFY_ENV] == '1'


@pytest.mark.slow
def test_the_startup_benchmark_sees_a_plain_start_read_no_corpus_and_a_verify_read_it_all():
  proc = run_module('benchmarks.data_build', '--quick', timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out['benchmark'] == 'data_startup' and out['same_store'] and out['corpus_mb'] == 4
  assert not out['startup_opened_corpus'] and out['startup_read_mb'] < 0.1 * out['corpus_mb']
  assert out['verify_opened_corpus'] and out['verify_read_mb'] >= out['corpus_mb']
  assert {'startup_s', 'verify_s', 'goal_s'} <= set(out)  # Printed; timings never compared.
