"""The token store: contents, reuse without tokenizing, new stores for changed inputs, killed
builds never trusted, parallel and concurrent builds."""

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from paxlike.data import TextData
from paxlike.data import packing
from paxlike.data import text_data
from paxlike.data import text_files
from paxlike.data import token_build
from paxlike.data import token_store
from paxlike.errors import UserError
from paxlike.tokenizers import BytesTokenizer, load_tokenizer
from paxlike.tokenizers import train as tokenizer_train
from tests.helpers import REPO

F = text_files.Fields


class CountingBytes(BytesTokenizer):
  """The byte tokenizer, counting its encode calls (the build's encode_flat)."""

  calls = 0

  def encode_flat(self, texts, num_threads=None):
    type(self).calls += 1
    return super().encode_flat(texts, num_threads)


class WideBytes(BytesTokenizer):
  vocab_size = 70_000
  fingerprint = 'wide-bytes'


@pytest.fixture(autouse=True)
def token_dir(tmp_path, monkeypatch):
  monkeypatch.setenv(token_store.TOKEN_DIR_ENV, str(tmp_path / 'tokens'))
  return tmp_path / 'tokens'


def corpus(tmp_path, n=50, name='c.jsonl', seed=0):
  rng = np.random.default_rng(seed)
  texts = [' '.join(f'w{x}' for x in rng.integers(0, 30, rng.integers(1, 20))) + f' #{i}'
           for i in range(n)]
  path = tmp_path / name
  path.write_text(''.join(json.dumps({'text': t, 'author': f'a{i % 3}'}) + '\n'
                          for i, t in enumerate(texts)))
  return texts, path


def documents(store):
  """Each document's tokens (EOS included), read back from the store."""
  start = np.asarray(store.doc_start)
  return [store.tokens_at(np.arange(start[d], start[d + 1])) for d in range(store.num_docs)]


def test_store_holds_each_document_then_eos_with_hash_file_and_client(tmp_path):
  texts, path = corpus(tmp_path)
  store = token_store.open_or_build(text_files.expand(str(path)), F(client_field='author'),
                                    BytesTokenizer(), 1)
  assert store.manifest['num_docs'] == 50 and store.shards[0].dtype == np.uint16
  for text, tokens in zip(texts, documents(store)):
    assert bytes(tokens[:-1].astype(np.uint8)).decode() == text and tokens[-1] == ord('\n')
  assert np.array_equal(store.doc_hash, token_build.text_hashes(texts, None))
  names = token_store.client_names(store)
  assert [names[c] for c in store.doc_client] == [f'a{i % 3}' for i in range(50)]
  assert (np.asarray(store.doc_file) == 0).all() and (np.asarray(store.doc_prompt) == 0).all()
  assert isinstance(store.shards[0], np.memmap)


def test_sentencepiece_store_decodes_back_and_sft_prompt_lengths(tmp_path):
  texts, path = corpus(tmp_path, n=200)
  (tmp_path / 'sp').mkdir()
  (tmp_path / 'sp/tokenizer.model').write_bytes(
      tokenizer_train.sentencepiece_model(texts * 5, 300))
  tok = load_tokenizer(tmp_path / 'sp')
  store = token_store.open_or_build({'c.jsonl': path}, F(), tok, 1)
  for text, tokens in zip(texts, documents(store)):
    assert tok.decode(tokens[:-1]) == text and tokens[-1] == tok.eos_id
  sft = tmp_path / 's.jsonl'
  sft.write_text(''.join(json.dumps({'prompt': t[:5], 'completion': t[5:]}) + '\n' for t in texts))
  store = token_store.open_or_build({'s.jsonl': sft}, F(prompt_field='prompt'), tok, 1)
  for text, tokens, prompt in zip(texts, documents(store), store.doc_prompt):
    # As TRL: prompt + completion tokenized whole, the prompt what it shares with the prompt
    # alone (a bare .model has no BOS rule).
    whole, alone = tok.encode_batch([text, text[:5]])
    assert np.array_equal(tokens, np.concatenate([whole, [tok.eos_id]]))
    shared = next((i for i, (x, y) in enumerate(zip(whole, alone)) if x != y),
                  min(len(whole), len(alone)))
    assert prompt == shared


def test_second_open_reuses_the_store_without_tokenizing(tmp_path, capsys):
  _, path = corpus(tmp_path)
  files = text_files.expand(str(path))
  CountingBytes.calls = 0
  first = token_store.open_or_build(files, F(), CountingBytes(), 1)
  assert CountingBytes.calls == 1 and 'tokenized 50 documents' in capsys.readouterr().err
  again = token_store.open_or_build(files, F(), CountingBytes(), 1)
  assert CountingBytes.calls == 1 and again.path == first.path
  assert capsys.readouterr().err == ''


def test_changed_file_tokenizer_or_fields_make_a_new_store(tmp_path):
  _, path = corpus(tmp_path)
  files = text_files.expand(str(path))
  base = token_store.open_or_build(files, F(), BytesTokenizer(), 1).path
  assert token_store.open_or_build(files, F(client_field='author'), BytesTokenizer(), 1
                                   ).path != base
  wide = token_store.open_or_build(files, F(), WideBytes(), 1)
  assert wide.path != base and wide.shards[0].dtype == np.uint32
  path.write_text(path.read_text().replace('#7"', '#seven"'))
  changed = token_store.open_or_build(files, F(), BytesTokenizer(), 1)
  assert changed.path != base and (base / 'manifest.json').is_file()  # The old one is intact.


def test_a_store_without_manifest_is_rebuilt_and_stale_builds_removed(tmp_path, token_dir):
  _, path = corpus(tmp_path)
  files = text_files.expand(str(path))
  store = token_store.open_or_build(files, F(), BytesTokenizer(), 1)
  (store.path / 'manifest.json').unlink()  # As if torn.
  (store.path / 'tokens-00000.bin').write_bytes(b'garbage')
  stale = token_dir / f'.tmp-{store.path.name}-99999-0123abcd'  # A killed writer's temp.
  stale.mkdir()
  CountingBytes.calls = 0
  rebuilt = token_store.open_or_build(files, F(), CountingBytes(), 1)
  assert CountingBytes.calls == 1 and not stale.exists()
  assert rebuilt.path == store.path and rebuilt.manifest['num_tokens'] > 7


KILLED_BUILD = '''
import sys, time
from paxlike.data import text_files, token_build, token_store
from paxlike.tokenizers import BytesTokenizer
class Slow(BytesTokenizer):
  def encode_flat(self, texts, num_threads=None):
    time.sleep(0.2)
    return super().encode_flat(texts, num_threads)
token_build.CHUNK_DOCS = text_files.BLOCK_ROWS = 5
token_store.open_or_build(text_files.expand(sys.argv[1]), text_files.Fields(), Slow(), 1)
'''


def test_kill_9_mid_build_leaves_nothing_trusted(tmp_path, token_dir):
  _, path = corpus(tmp_path, n=200)
  child = subprocess.Popen([sys.executable, '-c', KILLED_BUILD, str(path)], cwd=REPO,
                           env={**os.environ}, stderr=subprocess.DEVNULL)
  deadline = time.time() + 30
  while not list(token_dir.glob('.tmp-*/tokens-00000.bin')) and time.time() < deadline:
    time.sleep(0.05)
  time.sleep(0.3)  # A few chunks written.
  child.send_signal(signal.SIGKILL)
  child.wait()
  assert list(token_dir.glob('.tmp-*')) and not list(token_dir.glob('*/manifest.json'))
  CountingBytes.calls = 0
  store = token_store.open_or_build(text_files.expand(str(path)), F(), CountingBytes(), 1)
  assert CountingBytes.calls == 1 and store.num_docs == 200
  assert not list(token_dir.glob('.tmp-*'))


@pytest.mark.parametrize('pool_min_bytes', [0, 1 << 62])  # Processes; threads.
def test_workers_build_the_same_store(tmp_path, monkeypatch, token_dir, pool_min_bytes):
  _, path = corpus(tmp_path, n=300)
  files = text_files.expand(str(path))
  monkeypatch.setattr(token_build, 'CHUNK_DOCS', 40)
  monkeypatch.setattr(text_files, 'BLOCK_ROWS', 40)
  alone = token_store.open_or_build(files, F(), BytesTokenizer(), 1)
  os.rename(alone.path, token_dir / 'alone')
  monkeypatch.setattr(token_build, 'POOL_MIN_BYTES', pool_min_bytes)
  monkeypatch.setattr(token_build, 'PROCESS_MIN_WORKERS', 2)
  pools = []

  class Recorded(concurrent.futures.ProcessPoolExecutor):
    def __init__(self, *args, **kwargs):
      pools.append(self)
      super().__init__(*args, **kwargs)

  monkeypatch.setattr(concurrent.futures, 'ProcessPoolExecutor', Recorded)
  pooled = token_store.open_or_build(files, F(), BytesTokenizer(), 2)
  assert len(pools) == (pool_min_bytes == 0)
  for name in ('tokens-00000', *token_store.DOC_ARRAYS):
    assert (pooled.path / f'{name}.bin').read_bytes() == (token_dir / f'alone/{name}.bin'
                                                           ).read_bytes()


def test_encoders_share_the_cores(tmp_path, monkeypatch, token_dir):
  """Each of num_workers encoder threads calls the library with cores // num_workers threads
  (at least 1), on chunks from its own thread."""
  _, path = corpus(tmp_path, n=300)
  monkeypatch.setattr(token_build, 'CHUNK_DOCS', 40)
  monkeypatch.setattr(text_files, 'BLOCK_ROWS', 40)
  monkeypatch.setattr(os, 'cpu_count', lambda: 4)
  seen = []

  class Recording(BytesTokenizer):
    def encode_flat(self, texts, num_threads=None):
      seen.append((num_threads, threading.current_thread() is threading.main_thread()))
      return super().encode_flat(texts, num_threads)

  store = token_store.open_or_build(text_files.expand(str(path)), F(), Recording(), 2)
  assert store.num_docs == 300 and len(seen) >= 8
  assert set(seen) == {(2, False)}
  assert token_build.encoder_threads(3) == 1 and token_build.encoder_threads(8) == 1


def test_concurrent_builders_build_once(tmp_path):
  _, path = corpus(tmp_path)
  files = text_files.expand(str(path))
  CountingBytes.calls, paths = 0, []
  threads = [threading.Thread(target=lambda: paths.append(
      token_store.open_or_build(files, F(), CountingBytes(), 1).path)) for _ in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert CountingBytes.calls == 1 and len(set(paths)) == 1 and len(paths) == 3


def test_shards_read_as_one_array(tmp_path):
  writer = token_store.Writer(tmp_path, np.uint16, shard_tokens=10)
  docs = [np.arange(n, dtype=np.int32) + 100 * n for n in (4, 7, 12, 3, 9)]
  for pair in (docs[:2], docs[2:3], docs[3:]):
    lengths = np.array([len(d) for d in pair])
    writer.add(token_build.Encoded(np.concatenate(pair), lengths, np.zeros(len(pair), np.uint64),
                                   np.zeros(len(pair), np.int32)),
               np.zeros(len(pair), np.int32), np.zeros(len(pair), np.int32))
  writer.finish({'key': 'k'})
  store = token_store.Store.open(tmp_path)
  assert [len(s) for s in store.shards] == [11, 12, 12] and store.num_docs == 5
  every = np.concatenate(docs)
  index = np.random.default_rng(0).integers(0, len(every), size=(3, 17))
  assert np.array_equal(store.tokens_at(index), every[index])


def test_an_empty_corpus_is_a_user_error(tmp_path):
  (tmp_path / 'e.txt').write_text('\n \n')
  with pytest.raises(UserError, match='the 1 files hold no documents .skipped 1 empty'):
    token_store.open_or_build(text_files.expand(str(tmp_path / 'e.txt')), F(), BytesTokenizer(),
                              1)


def test_derived_arrays_are_cached_once_and_a_failed_make_leaves_nothing(tmp_path):
  _, path = corpus(tmp_path)
  store = token_store.open_or_build(text_files.expand(str(path)), F(), BytesTokenizer(), 1)
  calls = []

  def failing():
    calls.append(1)
    raise RuntimeError('killed')

  with pytest.raises(RuntimeError):
    token_store.derived(store, 'plan', 1, failing)
  assert not list((store.path / 'derived').glob('plan*'))

  def make():
    calls.append(1)
    return {'x': np.arange(5)}, {'n': 5}

  arrays, meta = token_store.derived(store, 'plan', 1, make)
  again, _ = token_store.derived(store, 'plan', 1, make)
  assert len(calls) == 2 and meta == {'n': 5} and isinstance(again['x'], np.memmap)
  assert np.array_equal(again['x'], np.arange(5))
  assert not list((store.path / 'derived').glob('.tmp-*'))


def test_a_new_version_of_derived_code_is_not_served_the_old_arrays(tmp_path):
  _, path = corpus(tmp_path)
  store = token_store.open_or_build(text_files.expand(str(path)), F(), BytesTokenizer(), 1)
  old, _ = token_store.derived(store, 'plan', 1, lambda: ({'x': np.arange(3)}, {'v': 1}))
  new, meta = token_store.derived(store, 'plan', 2, lambda: ({'x': np.arange(4)}, {'v': 2}))
  assert meta == {'v': 2} and np.array_equal(new['x'], np.arange(4))
  kept, meta = token_store.derived(store, 'plan', 1, lambda: pytest.fail('made again'))
  assert meta == {'v': 1} and np.array_equal(kept['x'], np.arange(3))


def test_textdata_computes_its_plan_again_under_a_bumped_plan_version(tmp_path, monkeypatch):
  _, path = corpus(tmp_path, n=200)
  plans = []
  made = text_data.make_packed
  monkeypatch.setattr(text_data, 'make_packed', lambda *a: plans.append(1) or made(*a))
  packed = lambda: TextData(files=str(path), seq_len=32, eval_fraction=0.1).packed
  first = packed()
  assert packed().meta == first.meta and len(plans) == 1  # Made once, then cached.
  monkeypatch.setattr(packing, 'PLAN_VERSION', packing.PLAN_VERSION + 1)
  assert packed().meta == first.meta and len(plans) == 2
