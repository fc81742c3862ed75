"""Fixed cohorts (slot i = client i every round) and natural clients grouped into domains."""

import collections

import numpy as np
import pytest

from paxlike.data import ImageData
from paxlike.data import LmData
from paxlike.data import prepare
from paxlike.data import partition
from paxlike.data import sources
from paxlike.errors import UserError


def test_contiguous_groups_are_ordered_non_empty_and_balanced():
  groups = partition.contiguous_groups([5, 1, 1, 1, 1, 1, 5, 1], 3)
  assert [g.tolist() for g in groups] == [[0], [1, 2, 3, 4, 5], [6, 7]]  # Totals 5, 6, 6.
  sizes = np.random.default_rng(0).integers(1, 100, 500)
  totals = [sizes[g].sum() for g in partition.contiguous_groups(sizes, 7)]
  assert max(totals) - min(totals) <= 2 * sizes.max()
  assert [len(g) for g in partition.contiguous_groups([100, 1, 1], 3)] == [1, 1, 1]
  with pytest.raises(ValueError, match='4 non-empty'):
    partition.contiguous_groups([1, 2, 3], 4)


def test_domains_keep_natural_clients_whole_in_order_of_first_appearance():
  ids = np.array(['c', 'a', 'c', 'b', 'a', 'd', 'b', 'e'])
  sizes = np.array([3, 1, 3, 2, 1, 4, 2, 8])  # c a | b d | e: 8, 8, 8.
  parts = partition.domains(ids, sizes, 3)
  joined = np.concatenate(parts)
  assert np.array_equal(np.sort(joined), np.arange(len(ids)))
  assert [sorted(set(ids[p])) for p in parts] == [['a', 'c'], ['b', 'd'], ['e']]
  assert all(p.dtype == np.int64 and np.array_equal(p, np.sort(p)) for p in parts)
  again = partition.domains(ids, sizes, 3)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_fixed_sampling_is_slot_i_client_i_with_size_weights():
  sizes = np.array([10, 20, 30])
  for step in (0, 1, 99):
    assert sources.sample_cohort(7, step, sizes, 3, 'fixed').tolist() == [0, 1, 2]
  assert sources.cohort_weights(sizes, np.arange(3), 'fixed').tolist() == [10.0, 20.0, 30.0]


@pytest.mark.parametrize('kwargs', [
    {'partition': 'domains', 'num_clients': 4, 'clients_per_round': 3, 'sampling': 'fixed'},
    {'partition': 'iid', 'num_clients': 4, 'clients_per_round': 5},
])
def test_fixed_cohort_must_cover_every_client(kwargs):
  with pytest.raises(UserError, match='clients_per_round'):
    LmData(**kwargs)
  with pytest.raises(UserError, match="sampling='fixed'"):
    ImageData(num_clients=4, clients_per_round=2, sampling='fixed')


def test_shakespeare_domains_fixed_cohort(prepared):
  data = LmData(dataset='shakespeare', partition='domains', num_clients=4, clients_per_round=4,
                sampling='fixed', local_steps=2, batch_size=3, seq_len=32)
  streams = data.train_streams
  natural = LmData(dataset='shakespeare', partition='natural').train_streams
  assert streams.sizes.sum() == natural.sizes.sum()
  # Near-equal domains: each of whole roles, so within twice the largest role of each other.
  assert streams.sizes.max() - streams.sizes.min() <= 2 * natural.sizes.max()
  assert streams.names[0].startswith('First Citizen..')  # Coriolanus opens the text.
  for step in (0, 5):
    batch, weights = data.round_batches(0, step)
    assert batch['inputs'].shape == (4, 2, 3, 32)
    assert np.array_equal(weights, streams.sizes.astype(np.float32))
    for slot in range(4):  # Slot i always reads domain i's stream.
      own = bytes(streams.tokens[streams.starts[slot]:streams.starts[slot] + streams.sizes[slot]])
      window = np.append(batch['inputs'][slot, 1, 2], batch['targets'][slot, 1, 2, -1])
      assert bytes(window.astype(np.uint8)) in own
  with pytest.raises(UserError, match=f'exceeds the {len(natural.names)}'):
    _ = LmData(dataset='shakespeare', partition='domains', num_clients=200).train_streams


def test_pooled_slots_sample_independently_with_equal_weights(prepared):
  data = LmData(dataset='shakespeare', partition='pooled', clients_per_round=4, seq_len=32,
                batch_size=2)
  batch, weights = data.round_batches(0, 0)
  assert len({bytes(batch['inputs'][i].astype(np.uint8)) for i in range(4)}) == 4
  assert len(set(weights.tolist())) == 1


def test_image_fixed_cohort_keeps_its_clients(prepared):
  data = ImageData(dataset='digits', partition='dirichlet', alpha=0.3, num_clients=4,
                   clients_per_round=4, sampling='fixed', batch_size=8)
  for step in (0, 3):
    batch, weights = data.round_batches(1, step)
    assert np.array_equal(weights, data.client_sizes.astype(np.float32))
    for slot in range(4):
      assert set(batch['targets'][slot].ravel().tolist()) <= set(
          data.train.labels[data.clients[slot]].tolist())


def test_shakespeare_statistics(prepared):
  info = LmData(dataset='shakespeare', partition='natural').describe()
  rows = prepare.read_split(prepare.prepared('shakespeare'), 'train')
  sizes = collections.Counter()  # Each role's training bytes, each speech with its separator.
  for row in rows.__getitems__(list(range(len(rows)))):
    sizes[row['client_id']] += len(row['text']) + 1
  assert info['population'] == len(sizes) > 16 and info['total'] == sum(sizes.values())
  assert info['min'] == min(sizes.values()) >= 800 and info['max'] == max(sizes.values())
  assert info['median'] < info['max']
