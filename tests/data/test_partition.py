"""Invariants of the client partitions."""

import numpy as np
import pytest

from paxlike.data import partition

LABELS = np.repeat(np.arange(10), 600)  # Balanced, like Fashion-MNIST's train split / 10.
SKEWED = np.random.default_rng(1).choice(7, size=1797, p=[.3, .2, .2, .1, .1, .05, .05])


def assert_exact_partition(parts, n):
  joined = np.concatenate(parts)
  assert len(joined) == n and np.array_equal(np.sort(joined), np.arange(n))
  assert partition.client_sizes(parts).sum() == n
  assert all(p.dtype == np.int64 for p in parts)


def mean_label_entropy(labels, parts):
  entropies = []
  for p in parts:
    freq = np.bincount(labels[p]) / len(p)
    freq = freq[freq > 0]
    entropies.append(-(freq * np.log(freq)).sum())
  return float(np.mean(entropies))


@pytest.mark.parametrize('make', [
    lambda seed: partition.iid(len(SKEWED), 37, seed),
    lambda seed: partition.dirichlet(SKEWED, 37, 0.3, seed),
    lambda seed: partition.shards(SKEWED, 37, 3, seed),
    lambda seed: partition.similarity(SKEWED, 37, 0.1, seed),
    lambda seed: partition.natural(SKEWED.astype(str)),
])
def test_every_example_in_exactly_one_client_and_deterministic(make):
  parts = make(5)
  assert_exact_partition(parts, len(SKEWED))
  again = make(5)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_seeds_change_the_random_partitions():
  for make in (lambda s: partition.iid(100, 4, s), lambda s: partition.dirichlet(LABELS, 10, 1, s),
               lambda s: partition.shards(LABELS, 10, 2, s)):
    assert not all(np.array_equal(a, b) for a, b in zip(make(0), make(1)))


def test_natural_groups_by_id_in_sorted_order():
  ids = np.array(['json', 'abc', 'json', 'os', 'abc', 'json'])
  parts = partition.natural(ids)
  assert [p.tolist() for p in parts] == [[1, 4], [0, 2, 5], [3]]
  assert partition.client_sizes(parts).tolist() == [2, 3, 1]


def test_iid_sizes_are_balanced():
  sizes = partition.client_sizes(partition.iid(1001, 10, 0))
  assert sizes.max() - sizes.min() <= 1


def test_dirichlet_skew_grows_as_alpha_falls():
  entropies = [mean_label_entropy(LABELS, partition.dirichlet(LABELS, 50, a, 0))
               for a in (100.0, 1.0, 0.1, 0.01)]
  assert all(a > b for a, b in zip(entropies, entropies[1:])), entropies
  assert entropies[0] > 0.95 * np.log(10)  # Large alpha: close to IID.
  sizes = partition.client_sizes(partition.dirichlet(SKEWED, 37, 0.05, 0))
  assert sizes.max() - sizes.min() <= 1  # Hsu et al.: equal-size clients.


def test_shards_give_at_most_shards_per_client_labels():
  for spc in (1, 2, 3):
    parts = partition.shards(LABELS, 20, spc, 0)  # 600 per class = whole shards.
    assert_exact_partition(parts, len(LABELS))
    assert max(len(np.unique(LABELS[p])) for p in parts) <= spc
    assert set(partition.client_sizes(parts).tolist()) == {6000 // 20}


def test_similarity_deals_its_fraction_iid_and_sorts_the_rest_by_label():
  """SCAFFOLD's s%: 0 is label-sorted contiguous clients (here one label each: 10 classes of
  600 over 10 clients), 1 is IID, 0.1 gives each client 60 random examples plus a 540-example
  piece of the label-sorted rest (mostly of one label: a piece may straddle two)."""
  zero = partition.similarity(LABELS, 10, 0.0, 0)
  assert [np.unique(LABELS[p]).tolist() for p in zero] == [[k] for k in range(10)]
  one = partition.similarity(LABELS, 10, 1.0, 0)
  assert_exact_partition(one, len(LABELS))
  assert min(len(np.unique(LABELS[p])) for p in one) == 10
  tenth = partition.similarity(LABELS, 10, 0.1, 0)
  assert_exact_partition(tenth, len(LABELS))
  for k, p in enumerate(tenth):
    counts = np.bincount(LABELS[p], minlength=10)
    assert len(p) == 600 and counts.argmax() == k and 0.85 * 600 <= counts[k] < 600
  entropies = [mean_label_entropy(LABELS, partition.similarity(LABELS, 10, s, 0))
               for s in (0.0, 0.1, 0.5, 1.0)]
  assert all(a < b for a, b in zip(entropies, entropies[1:])), entropies


def test_image_data_refuses_a_similarity_outside_0_1():
  from paxlike.data.images import ImageData
  from paxlike.errors import UserError
  with pytest.raises(UserError, match=r'ImageData.similarity must be in \[0, 1\], got 1.5'):
    ImageData(partition='similarity', similarity=1.5)
