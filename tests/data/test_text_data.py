"""TextData: batches a pure function of (seed, step), blocks equal slices, every token once
per epoch, stable held-out split, federated partitions, SFT masks, config errors."""

import dataclasses
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from paxlike.data import fingerprint
from paxlike.data import row_order
from paxlike.data.text_files import Fields
from paxlike.data import sources
from paxlike.data import token_build
from paxlike.data import text_data
from paxlike.data import token_store
from paxlike.data.text_data import TextData
from paxlike.errors import UserError
from tests.fixture_data import SHAKESPEARE_SLICE as SHAKESPEARE


@pytest.fixture(autouse=True)
def token_dir(tmp_path, monkeypatch):
  monkeypatch.setenv(token_store.TOKEN_DIR_ENV, str(tmp_path / 'tokens'))


def write_jsonl(path, rows):
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  return str(path)


def texts_of(letters, n, seed):
  """n distinct texts of the given letters, of 1 to 60 characters."""
  rng = np.random.default_rng(seed)
  return [''.join(rng.choice(list(letters), rng.integers(1, 60))) + str(i) for i in range(n)]


def byte_counts(batch):
  """How often each byte is a trained target."""
  return np.bincount(batch['targets'][batch['mask'] == 1], minlength=256)


def expected_counts(texts, keep):
  """Each kept document's bytes and EOS, less its first byte (never a target)."""
  total = np.zeros(256, np.int64)
  for text in texts:
    if keep(text):
      total += np.bincount(np.frombuffer((text + '\n').encode()[1:], np.uint8), minlength=256)
  return total


def heldout(text, fraction=0.1):
  return int(token_build.text_hashes([text], None)[0]) < fraction * 2**64


@pytest.fixture
def corpus(tmp_path):
  texts = texts_of('abcdef ', 300, 0)
  return texts, write_jsonl(tmp_path / 'c.jsonl', [{'text': t} for t in texts])


def test_round_batches_are_a_pure_function_of_seed_and_step(corpus):
  data = TextData(files=corpus[1], seq_len=32, batch_size=4, eval_fraction=0.1)
  again = TextData(files=corpus[1], seq_len=32, batch_size=4, eval_fraction=0.1)
  for step in (0, 1, 7, 10**6, -1):
    a, b = data.round_batches(3, step)[0], again.round_batches(3, step)[0]
    assert a.keys() == {'inputs', 'targets', 'mask', 'segment_ids', 'positions'}
    assert all(np.array_equal(a[k], b[k]) for k in a) and a['inputs'].shape == (1, 1, 4, 32)
  assert not np.array_equal(data.round_batches(3, 1)[0]['inputs'],
                            data.round_batches(3, 2)[0]['inputs'])
  assert not np.array_equal(data.round_batches(3, 1)[0]['inputs'],
                            data.round_batches(4, 1)[0]['inputs'])
  # Pooled cohort slots read consecutive stretches of the one stream: slot q of round s is
  # round 2s + q of a one-slot run.
  pair = dataclasses.replace(data, clients_per_round=2)
  for step in (0, 3):
    both = pair.round_batches(3, step)[0]['inputs']
    assert np.array_equal(both[0], data.round_batches(3, 2 * step)[0]['inputs'][0])
    assert np.array_equal(both[1], data.round_batches(3, 2 * step + 1)[0]['inputs'][0])


def test_a_pickled_copy_reopens_the_store_instead_of_copying_it(corpus):
  data = TextData(files=corpus[1], seq_len=32, eval_fraction=0.1)
  batch = data.round_batches(0, 3)[0]
  blob = pickle.dumps(data)
  assert len(blob) < 2000  # Fields and the tokenizer, no token arrays.
  copy = pickle.loads(blob)
  assert all(np.array_equal(copy.round_batches(0, 3)[0][k], batch[k]) for k in batch)


@pytest.mark.parametrize('partition', ['pooled', 'file'])
def test_a_block_equals_the_same_slice_of_the_whole(tmp_path, partition):
  files = [write_jsonl(tmp_path / f'{i}.jsonl', [{'text': t} for t in texts_of('xyz ', 80, i)])
           for i in range(4)]
  data = TextData(files=files, seq_len=16, batch_size=6, clients_per_round=4, local_steps=2,
                  partition=partition, eval_fraction=0.1)
  whole, weights = data.round_batches(0, 5)
  assert whole['inputs'].shape == (4, 2, 6, 16)
  for clients, rows in ((slice(0, 2), slice(None)), (slice(2, 4), slice(3, 6)),
                        (slice(1, 2), slice(0, 2))):
    block, block_weights = data.round_batches(0, 5, clients=clients, rows=rows)
    assert np.array_equal(block_weights, weights)
    for key in whole:
      assert np.array_equal(block[key], whole[key][clients, :, rows])


def test_stragglers_mask_a_slots_later_steps_only(tmp_path):
  """data.straggler_fraction: the same rows and weights, each straggler's later local steps
  masked out (sources.straggler_steps), blocks still slices of the whole; off, no STEP_MASK."""
  files = [write_jsonl(tmp_path / f'{i}.jsonl', [{'text': t} for t in texts_of('xyz ', 80, i)])
           for i in range(4)]
  kw = dict(files=files, seq_len=16, batch_size=3, clients_per_round=8, local_steps=4,
            eval_fraction=0.1)
  base, base_weights = TextData(**kw).round_batches(1, 3)
  assert sources.STEP_MASK not in base
  slow = TextData(**kw, straggler_fraction=0.6)
  batch, weights = slow.round_batches(1, 3)
  steps = sources.straggler_steps(1, 3, np.ones(8, bool), 4, 0.6)
  assert 0 < np.sum(steps < 4) < 8
  runs = np.arange(4)[None, :] < steps[:, None]
  assert np.array_equal(weights, base_weights)
  for key in ('inputs', 'targets', 'segment_ids', 'positions'):
    assert np.array_equal(batch[key], base[key])
  assert np.array_equal(batch['mask'], np.where(runs[..., None, None], base['mask'], 0))
  assert np.array_equal(batch[sources.STEP_MASK], np.broadcast_to(runs[..., None], (8, 4, 3)))
  block, _ = slow.round_batches(1, 3, clients=slice(2, 6), rows=slice(1, 3))
  for key in batch:
    assert np.array_equal(block[key], batch[key][2:6, :, 1:3])
  with pytest.raises(UserError, match='TextData.straggler_fraction=0.5 needs local_steps >= 2'):
    TextData(files=files, straggler_fraction=0.5)
  with pytest.raises(UserError, match='TextData.straggler_fraction must be a number in'):
    TextData(files=files, straggler_fraction=1.0, local_steps=2)


def test_every_training_token_is_a_target_once_per_epoch(corpus):
  texts, files = corpus
  data = TextData(files=files, seq_len=24, batch_size=1, eval_fraction=0.1)
  rows = data.packed.train.num_rows
  epoch = [data.round_batches(0, s)[0] for s in range(rows)]
  assert np.array_equal(sum(byte_counts(b) for b in epoch),
                        expected_counts(texts, lambda t: not heldout(t)))
  firsts = [data.round_batches(0, s)[0]['inputs'][0, 0, 0, :5].tolist() for s in range(rows)]
  seconds = [data.round_batches(0, s)[0]['inputs'][0, 0, 0, :5].tolist()
             for s in range(rows, 2 * rows)]
  assert sorted(firsts) == sorted(seconds) and firsts != seconds  # Each epoch its own order.


@pytest.mark.parametrize('small_rows', [1 << 16, 0])  # numpy permutations; grain's shuffle.
def test_each_clients_epochs_are_permutations_of_its_rows(monkeypatch, small_rows):
  monkeypatch.setattr(row_order, 'SMALL_ROWS', small_rows)
  client_rows = np.array([0, 7, 7 + 300])
  for client, (lo, hi) in enumerate(zip(client_rows[:-1], client_rows[1:])):
    n = hi - lo
    rows = row_order.shuffled_rows(5, np.full(3 * n, client), np.arange(3 * n), client_rows)
    epochs = rows.reshape(3, n)
    assert all(sorted(e) == list(range(lo, hi)) for e in epochs)
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
    before = row_order.shuffled_rows(5, np.full(n, client), np.arange(-n, 0), client_rows)
    assert sorted(before) == list(range(lo, hi))  # Negative steps (personalization) too.


def test_whole_eval_split_scores_every_heldout_token_once(corpus):
  texts, files = corpus
  data = TextData(files=files, seq_len=24, eval_fraction=0.1, eval_batch_size=5,
                  num_eval_batches=None)
  batches = data.eval_batches()
  assert len(batches) == -(-data.packed.eval.num_rows // 5)
  assert np.array_equal(sum(byte_counts(b) for b in batches), expected_counts(texts, heldout))
  last = batches[-1]
  empty = 5 * len(batches) - data.packed.eval.num_rows
  assert empty == 0 or last['mask'][-empty:].sum() == 0
  some = dataclasses.replace(data, num_eval_batches=2)
  assert len(some.eval_batches()) == 2
  sliced = some.eval_batches(rows=slice(1, 3))
  assert all(np.array_equal(s[k], w[k][1:3]) for s, w in zip(sliced, some.eval_batches())
             for k in s)


def test_heldout_split_is_stable_when_a_file_is_added(tmp_path):
  first = texts_of('ab ', 400, 1)
  a = write_jsonl(tmp_path / 'a.jsonl', [{'text': t} for t in first])
  b = write_jsonl(tmp_path / 'b.jsonl', [{'text': t} for t in texts_of('cd ', 400, 2)])

  def heldout_texts(data):
    store = data.store
    start = np.asarray(store.doc_start)
    flags = store.heldout(data.eval_fraction)
    tokens = [store.tokens_at(np.arange(start[d], start[d + 1] - 1))
              for d in np.flatnonzero(flags)]
    return {bytes(t.astype(np.uint8)).decode() for t in tokens}

  alone = heldout_texts(TextData(files=a, eval_fraction=0.2))
  both = heldout_texts(TextData(files=[a, b], eval_fraction=0.2))
  assert alone == {t for t in both if t in set(first)} and 40 < len(alone) < 120


def test_file_partition_reads_each_clients_own_rows(tmp_path):
  letters = ['a', 'b', 'c']
  files = [write_jsonl(tmp_path / f'{x}.jsonl',
                       [{'text': x * (1 + i % 40)} for i in range(60 * (k + 1))])
           for k, x in enumerate(letters)]
  data = TextData(files=files, seq_len=16, batch_size=3, partition='file', sampling='fixed',
                  clients_per_round=3, eval_fraction=0.2)
  batch, weights = data.round_batches(0, 4)
  for slot, x in enumerate(letters):
    trained = set(batch['targets'][slot][batch['mask'][slot] == 1].tolist())
    assert trained <= {ord(x), ord('\n')}
  sizes = data.packed.client_tokens
  assert np.array_equal(weights, sizes.astype(np.float32)) and sizes[0] < sizes[1] < sizes[2]
  assert data.client_names == ('a.jsonl', 'b.jsonl', 'c.jsonl')
  with pytest.raises(UserError, match='clients_per_round=4 exceeds the 3 clients'):
    dataclasses.replace(data, clients_per_round=4, sampling='uniform').round_batches(0, 1)


def test_poisson_cohorts_pad_to_fixed_slots_that_train_nothing(tmp_path):
  """sampling='poisson' (for DP's accounting): each round's joined clients (sources.poisson_
  cohort) lead, each slot with its own client's rows; the padded slots run no step and weigh
  nothing; a pooled corpus has no clients to draw."""
  letters = 'abcdefghij'
  files = [write_jsonl(tmp_path / f'{x}.jsonl', [{'text': x * (1 + i % 30)} for i in range(40)])
           for x in letters]
  data = TextData(files=files, seq_len=16, batch_size=2, partition='file', sampling='poisson',
                  clients_per_round=3, local_steps=2, eval_fraction=0.2)
  assert data.num_slots == sources.poisson_slots(10, 3)
  for step in range(1, 6):
    batch, weights = data.round_batches(4, step)
    cohort = sources.poisson_cohort(4, step, 10, 3)
    joined = cohort != sources.PADDED
    assert batch['mask'].shape[:3] == (data.num_slots, 2, 2) and 0 < joined.sum() < len(cohort)
    assert np.array_equal(weights, np.where(joined, data.packed.client_tokens[np.maximum(
        cohort, 0)], 0).astype(np.float32))
    assert np.array_equal(batch[sources.STEP_MASK], np.broadcast_to(joined[:, None, None],
                                                                     (len(cohort), 2, 2)))
    assert not batch['mask'][~joined].any()
    for slot in np.flatnonzero(joined):
      trained = set(batch['targets'][slot][batch['mask'][slot] == 1].tolist())
      assert trained and trained <= {ord(letters[cohort[slot]]), ord('\n')}
    block, _ = data.round_batches(4, step, clients=slice(2, 6), rows=slice(1, 2))
    for key in batch:
      assert np.array_equal(block[key], batch[key][2:6, :, 1:2])
  with pytest.raises(UserError, match="sampling='poisson' draws clients, and partition='pooled'"):
    TextData(files=files, sampling='poisson')


def test_field_partition_and_its_per_client_eval_groups(tmp_path):
  rows = [{'text': x * (1 + i % 30), 'author': x.upper()} for i in range(300) for x in 'pqr']
  data = TextData(files=write_jsonl(tmp_path / 'r.jsonl', rows), seq_len=20, partition='field',
                  fields=Fields(client_field='author'), clients_per_round=2, eval_fraction=0.2,
                  num_eval_batches=None)
  assert data.client_names == ('P', 'Q', 'R')
  client_eval = data.client_eval()
  for batch, group in zip(data.eval_batches(), client_eval.groups):
    scored = batch['mask'] == 1
    letters = np.array(['pqr'.index(chr(t)) if chr(t) in 'pqr' else -1
                        for t in batch['targets'][scored]])
    known = letters >= 0  # EOS targets have no letter of their own.
    assert np.array_equal(group[scored][known], letters[known])
    assert (group[~scored & (batch['segment_ids'] == 0)] == -1).all()
  assert np.array_equal(client_eval.mix, np.eye(3))
  assert TextData(files=str(tmp_path / 'r.jsonl')).client_eval() is None


def test_sft_batches_score_completion_and_eos_only(tmp_path):
  rows = [{'prompt': 'Q' * (1 + i % 9), 'completion': 'a' * (1 + i % 5)} for i in range(200)]
  data = TextData(files=write_jsonl(tmp_path / 's.jsonl', rows), seq_len=16, batch_size=1,
                  fields=Fields(prompt_field='prompt'), eval_fraction=0.1)
  epoch = [data.round_batches(0, s)[0] for s in range(data.packed.train.num_rows)]
  counts = sum(byte_counts(b) for b in epoch)
  hashes = token_build.text_hashes([r['completion'] for r in rows], [r['prompt'] for r in rows])
  train = [r for r, h in zip(rows, hashes.tolist()) if not h < 0.1 * 2**64]
  assert counts[ord('Q')] == 0 and counts[ord('\n')] == len(train)
  assert counts[ord('a')] == sum(len(r['completion']) for r in train)


def test_tiny_shakespeare_lines_pack_to_over_99_percent_at_seq_512():
  data = TextData(files=str(SHAKESPEARE), fields=Fields(txt_document='line'), seq_len=512)
  info = data.describe()
  assert info['packing_efficiency'] >= 0.99 and info['vocab_size'] == data.vocab_size == 256
  assert info['documents'] == sum(1 for line in SHAKESPEARE.read_text().splitlines()
                                  if line.strip())


def test_job_dir_fingerprint_is_the_store_key_and_changes_with_a_file(corpus, tmp_path):
  texts, files = corpus
  data = TextData(files=files, eval_fraction=0.1)
  record = data.fingerprint()
  assert record['dataset'] == 'text' and record['sha256'] == data.store.manifest['key']
  fingerprint.record(tmp_path, record)
  Path(files).write_text(Path(files).read_text().replace(texts[0], texts[0] + '!'))
  changed = TextData(files=files, eval_fraction=0.1).fingerprint()
  assert 'was trained on text data' in fingerprint.mismatch(tmp_path, changed)


@pytest.mark.parametrize('fields, message', [
    ({'files': ()}, 'files must be a glob or a list of globs'),
    ({'files': ['a', 3]}, 'files must be a glob'),
    ({'seq_len': 0}, 'seq_len must be a positive int'),
    ({'fields': {'txt_document': 'line'}}, 'fields must be a paxlike.data.text_files.Fields'),
    ({'partition': 'field'}, "partition='field' and fields.client_field go together"),
    ({'fields': Fields(client_field='author')},
     "partition='field' and fields.client_field go together"),
    ({'eval_fraction': 0}, r'eval_fraction must be in \(0, 1\)'),
    ({'num_eval_batches': 0}, 'num_eval_batches must be a positive int or None'),
    ({'tokenizer': ''}, 'tokenizer must be a non-empty string'),
    ({'sampling': 'most'}, 'sampling must be one of'),
])
def test_config_errors_are_one_line_user_errors(fields, message):
  with pytest.raises(UserError, match=message) as error:
    TextData(**{'files': 'x.txt', **fields})
  assert '\n' not in str(error.value)


@pytest.mark.parametrize('fields, message', [
    ({'txt_document': 'page'}, 'txt_document must be one of file, line, paragraph'),
    ({'text_field': ''}, 'text_field must be a non-empty string'),
    ({'client_field': 3}, 'client_field must be None or a field name'),
    ({'prompt_field': 'p', 'messages_field': 'm'}, 'two formats of SFT rows'),
])
def test_bad_fields_are_one_line_user_errors(fields, message):
  with pytest.raises(UserError, match=message):
    Fields(**fields)


def test_too_small_a_corpus_for_both_splits_is_a_user_error(tmp_path):
  files = write_jsonl(tmp_path / 'one.jsonl', [{'text': 'only one document'}])
  with pytest.raises(UserError, match='holds out 0 of the 1 documents'):
    TextData(files=files, eval_fraction=0.01).round_batches(0, 1)
