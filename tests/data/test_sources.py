"""round_batches / eval_batches of LmData and ImageData on the real data."""

import dataclasses
import time

import fiddle as fdl
import numpy as np
import pytest

from paxlike.data import DataSource
from paxlike.data import ImageData
from paxlike.data import LmData
from paxlike.data import sources
from paxlike.errors import UserError

KEYS = {'inputs', 'targets', 'mask'}


def cohort_lm(**kwargs) -> LmData:
  return LmData(**{'dataset': 'shakespeare', 'partition': 'natural', 'clients_per_round': 16,
                   'local_steps': 4, 'batch_size': 8, 'seq_len': 80, **kwargs})


def assert_same(a, b):
  assert a[0].keys() == b[0].keys() == KEYS
  for key in KEYS:
    assert a[0][key].dtype == b[0][key].dtype and np.array_equal(a[0][key], b[0][key])
  assert np.array_equal(a[1], b[1])


def test_lm_rounds_are_pure_functions_of_seed_and_step(prepared):
  first = [cohort_lm().round_batches(3, s) for s in range(6)]
  resumed = cohort_lm()  # A rebuilt object, as after a restart at round 4.
  for s in (4, 5, 0):
    assert_same(first[s], resumed.round_batches(3, s))
  assert not np.array_equal(first[0][0]['inputs'], first[1][0]['inputs'])
  assert not np.array_equal(first[0][0]['inputs'], cohort_lm().round_batches(4, 0)[0]['inputs'])


def test_lm_shapes_shift_weights_and_client_streams(prepared):
  data = cohort_lm()
  batch, weights = data.round_batches(0, 7)
  assert isinstance(data, DataSource)
  assert batch['inputs'].shape == batch['mask'].shape == (16, 4, 8, 80)
  assert batch['inputs'].dtype == batch['targets'].dtype == np.int32
  assert batch['mask'].dtype == weights.dtype == np.float32 and batch['mask'].min() == 1
  assert np.array_equal(batch['inputs'][..., 1:], batch['targets'][..., :-1])
  assert 0 <= batch['inputs'].min() and batch['targets'].max() < data.vocab_size
  streams = data.train_streams
  cohort = sources.sample_cohort(0, 7, streams.sizes, 16, 'uniform')
  assert len(set(cohort.tolist())) == 16
  assert np.array_equal(weights, streams.sizes[cohort].astype(np.float32))
  for j, c in enumerate(cohort[:4]):  # Every window comes from its own client's stream.
    own = bytes(streams.tokens[streams.starts[c]:streams.starts[c] + streams.sizes[c]])
    window = bytes(np.append(batch['inputs'][j, 2, 5], batch['targets'][j, 2, 5, -1]).astype(np.uint8))
    assert window in own


def test_lm_weighted_sampling_prefers_large_roles(prepared):
  data = cohort_lm(sampling='weighted', clients_per_round=4)
  sizes = data.train_streams.sizes
  picked = np.concatenate([sources.sample_cohort(1, s, sizes, 4, 'weighted') for s in range(200)])
  assert sizes[picked].mean() > 1.25 * sizes.mean()
  assert np.array_equal(data.round_batches(1, 0)[1], np.ones(4, np.float32))


def test_lm_batching_is_fast(prepared):
  data = cohort_lm()
  data.round_batches(0, 0)
  times = []
  for step in range(1, 51):
    start = time.perf_counter()
    data.round_batches(0, step)
    times.append(time.perf_counter() - start)
  assert np.median(times) < 0.010


def test_lm_pooled_stdlib_and_eval(prepared):
  data = LmData(dataset='stdlib', seq_len=64, batch_size=4, eval_batch_size=5, num_eval_batches=3)
  batch, weights = data.round_batches(0, 0)
  assert batch['inputs'].shape == (1, 1, 4, 64) and weights.shape == (1,)
  evals = data.eval_batches()
  assert len(evals) == 3 and all(e.keys() == KEYS and e['inputs'].shape == (5, 64) for e in evals)
  assert all(np.array_equal(a['inputs'], b['inputs'])
             for a, b in zip(evals, dataclasses.replace(data).eval_batches()))
  info = data.describe()
  assert info['population'] == 1 and info['total'] > 5_000_000


def test_lm_natural_stdlib_clients_and_min_chars(prepared):
  data = LmData(dataset='stdlib', partition='natural', min_client_chars=20_000)
  names = data.train_streams.names
  assert {'json', 'asyncio', 'email'} <= set(names) and 'this' not in names
  assert data.train_streams.sizes.min() >= 20_000
  assert data.describe()['population'] == len(names) < 200


def test_image_rounds_pure_shapes_and_client_labels(prepared):
  make = lambda: ImageData(dataset='fashion_mnist', num_clients=100, partition='shards',
                           clients_per_round=10, local_steps=3, batch_size=16)
  data = make()
  batch, weights = data.round_batches(2, 9)
  assert_same((batch, weights), make().round_batches(2, 9))
  assert batch['inputs'].shape == (10, 3, 16, 28, 28, 1) and batch['inputs'].dtype == np.float32
  assert batch['targets'].shape == batch['mask'].shape == (10, 3, 16)
  assert 0.0 <= batch['inputs'].min() and batch['inputs'].max() <= 1.0
  assert np.array_equal(weights, np.full(10, len(data.train.labels) // 100, np.float32))
  cohort = sources.sample_cohort(2, 9, data.client_sizes, 10, 'uniform')
  for j, c in enumerate(cohort):
    assert set(batch['targets'][j].ravel().tolist()) <= set(data.train.labels[data.clients[c]])
    assert len(np.unique(batch['targets'][j])) <= 2


def test_image_small_clients_cycle_and_eval_covers_test_once(prepared):
  data = ImageData(dataset='digits', num_clients=200, partition='dirichlet', alpha=0.1,
                   clients_per_round=5, local_steps=4, batch_size=8, eval_batch_size=100)
  batch, weights = data.round_batches(0, 0)
  assert batch['inputs'].shape == (5, 4, 8, 8, 8, 1) and set(weights.tolist()) <= {7.0, 8.0}
  evals = data.eval_batches()
  n_test = len(data.test.labels)
  assert len(evals) == -(-n_test // 100) and sum(e['mask'].sum() for e in evals) == n_test
  assert evals[-1]['mask'][-1] == 0 and evals[0]['inputs'].shape == (100, 8, 8, 1)
  info = data.describe()
  assert (info['population'], info['total'], info['num_classes']) == (200, 1438, 10)


@pytest.mark.parametrize('cls,kwargs,field', [
    (LmData, {'seq_len': 0}, 'seq_len'),
    (LmData, {'partition': 'random'}, 'partition'),
    (LmData, {'dataset': 'c4'}, 'dataset'),
    (ImageData, {'batch_size': -1}, 'batch_size'),
    (ImageData, {'alpha': 0.0}, 'alpha'),
    (ImageData, {'num_clients': 4, 'clients_per_round': 5}, 'clients_per_round'),
])
def test_invalid_fields_are_user_errors(cls, kwargs, field):
  with pytest.raises(UserError, match=field):
    cls(**kwargs)


def test_cohort_larger_than_natural_clients_is_a_user_error(prepared):
  with pytest.raises(UserError, match='clients_per_round'):
    cohort_lm(clients_per_round=10_000).round_batches(0, 0)
  with pytest.raises(UserError, match='min_client_chars'):
    cohort_lm(min_client_chars=10**9).round_batches(0, 0)


def test_fiddle_configurable(prepared):
  config = fdl.Config(LmData, dataset='shakespeare', seq_len=32, batch_size=2)
  config.partition = 'natural'
  data = fdl.build(config)
  assert data == LmData(dataset='shakespeare', seq_len=32, batch_size=2, partition='natural')
  assert fdl.build(fdl.Config(ImageData, num_clients=3)).num_classes == 10


@pytest.mark.parametrize('make', [
    lambda: cohort_lm(),
    lambda: cohort_lm(partition='pooled', clients_per_round=4),
    lambda: ImageData(dataset='digits', num_clients=50, partition='dirichlet', alpha=0.3,
                      clients_per_round=6, local_steps=2, batch_size=10),
], ids=['lm_natural', 'lm_pooled', 'image_dirichlet'])
def test_a_process_block_equals_the_same_slice_of_the_whole_round(prepared, make):
  """Each process loads only its block of a round; it must be that part of the global batch."""
  data = make()
  whole, weights = data.round_batches(5, 11)
  for clients, rows in [(slice(0, 2), slice(4, 8)), (slice(2, None), slice(None, 2)),
                        (slice(None), slice(None))]:
    block, block_weights = make().round_batches(5, 11, clients=clients, rows=rows)
    assert_same((block, block_weights), ({k: v[clients, :, rows] for k, v in whole.items()},
                                         weights))
  evals = data.eval_batches()
  for rows in (slice(0, 3), slice(3, None)):
    for block, batch in zip(make().eval_batches(rows=rows), evals):
      assert all(np.array_equal(block[k], batch[k][rows]) for k in KEYS)
