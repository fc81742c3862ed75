"""The full data sets in the real data root (README.md, "Data for the full experiments"): what
the experiments and reproductions are sized for, and the partitions existing job dirs were
trained on. Marked full_data: skipped, naming what is missing, where the data root lacks them;
CI runs them on ../shared/data (.ci/run)."""

import numpy as np
import pytest

from paxlike.data import LmData
from paxlike.data import prepare
from tests.data.test_partition_digests import digest

pytestmark = pytest.mark.full_data

# Tiny Shakespeare's partitions, as every job dir of the Shakespeare experiments holds them.
PINNED = {
    'natural': ({'partition': 'natural'},
                'a1c076a5899c14a44b9723cf514e5693bb39b35ed8d7183e6e62a46d7945bff7'),
    'domains': ({'partition': 'domains', 'num_clients': 4},
                'b44b841714b2cfa2c12f7aa3198076350d64c302f5adfdbab84ac74007215e3f'),
    'iid': ({'partition': 'iid', 'num_clients': 10},
            'b5b16e173d74d3ec5fa45a8d938505bfaa542815383a9beb8ec3e69ddd88dee9'),
}


def test_fashion_mnist_is_the_full_set(prepared):
  directory = prepare.prepared('fashion_mnist')
  train, test = prepare.read_split(directory, 'train'), prepare.read_split(directory, 'test')
  assert (len(train), len(test)) == (60_000, 10_000)
  example = train[123]
  assert example['image'].shape == (28, 28, 1) and example['image'].dtype == np.uint8
  labels = np.array([e['label'] for e in test.__getitems__(list(range(0, 10_000, 7)))])
  assert set(labels.tolist()) == set(range(10))


def test_shakespeare_is_the_full_text_with_its_147_roles(prepared):
  assert len(prepare.read_split(prepare.prepared('shakespeare'), 'train')) == 5852
  info = LmData(dataset='shakespeare', partition='natural').describe()
  assert info['population'] == 147 and info['min'] >= 800
  assert info['median'] < info['max'] and info['total'] > 900_000


@pytest.mark.parametrize('name', PINNED)
def test_shakespeare_partition_is_unchanged(prepared, name):
  fields, pinned = PINNED[name]
  assert digest(LmData(dataset='shakespeare', **fields).train_streams) == pinned
