"""Pinned digests of the partitions: which client holds which examples (Shakespeare: the suite's
slice, tests/fixture_data.py; the full text's are pinned in test_full_data.py).

A job dir's clients are a function of its saved config. A refactor of the partition code, or a
numpy whose random streams differ, that reshuffles them would silently change every existing
run on resume; these digests make it fail here instead. If a change is meant to reshuffle, say
so in its commit and update the digest.
"""

import hashlib
import sys
from typing import Callable

import numpy as np
import pytest

from paxlike.data import ImageData, LmData
from paxlike.data.lm import Streams


def digest(clients: Streams | list[np.ndarray]) -> str:
  """sha256 over the training clients in order. LM streams: each client's name and bytes (its
  documents, in order, as it trains on them); images: each client's example indices."""
  h = hashlib.sha256()
  if isinstance(clients, Streams):
    for name, start, size in zip(clients.names, clients.starts, clients.sizes):
      h.update(f'{name}\0{size}\0'.encode())
      h.update(clients.tokens[start:start + size].tobytes())
    return h.hexdigest()
  for client in clients:
    h.update(f'{len(client)}\0'.encode())
    h.update(np.asarray(client, np.int64).tobytes())
  return h.hexdigest()


# The partitions of the registered experiments (paxlike/experiments/federated.py), on the suite's
# data; partition_seed is 0 throughout. Label shards (FashionMnistFedAvg) are pinned on digits: the
# same code, on a data set that is the same everywhere.
PINNED: dict[str, tuple[Callable[[], Streams | list[np.ndarray]], str]] = {
    'shakespeare by role (FedAvg, FedAdam, PAPA)': (
        lambda: LmData(dataset='shakespeare', partition='natural').train_streams,
        '1aaba444578bea4c9b9fa5576adaf50077fd168fffbc9bda715429c672f873ab'),
    'shakespeare in 4 domains (DiLoCo, BTM)': (
        lambda: LmData(dataset='shakespeare', partition='domains', num_clients=4).train_streams,
        '38c259e787432b188b4e7729402c98db31a8eee380214a71116ef7cbdc57a4df'),
    'shakespeare iid, 10 clients': (
        lambda: LmData(dataset='shakespeare', partition='iid', num_clients=10).train_streams,
        'bd89f57fb959faeb6af7d75ae263de2053d21bd8d2c885c5dd582f233f64fdee'),
    'digits dirichlet(0.3), 20 clients (DigitsFedAvg)': (
        lambda: ImageData(dataset='digits', partition='dirichlet', alpha=0.3,
                          num_clients=20).clients,
        'edf13d7aa5037c9f06eb9907c4ca8fe411952d5bbc27d70ec79fab7f5a9d31fc'),
    'digits 2 shards each, 20 clients': (
        lambda: ImageData(dataset='digits', partition='shards', num_clients=20,
                          shards_per_client=2).clients,
        'c69fa6641198fa81e20618ec92ab1f5dd96a1abbb09e1b03c1d81eaff896e2bf'),
}
# The stdlib is the running interpreter's own (its prepared data is keyed by the full version,
# see data/stdlib.py), so its partition is pinned per Python version.
STDLIB_BY_MODULE = {
    '3.11.7': '2c08187a45ce2ae1f8de78388836bde90b85b7589c6221637a555ea575f6d70f',
    '3.12.1': '5f03a4e32c2dc4ef425d401f0b15d87cde89215ab27f7dfa2a8314d53febc7ee',
}


@pytest.mark.parametrize('name', PINNED)
def test_partition_is_unchanged(prepared, name):
  clients, pinned = PINNED[name]
  assert digest(clients()) == pinned


def test_stdlib_by_module_is_unchanged(prepared):
  version = '.'.join(map(str, sys.version_info[:3]))
  if version not in STDLIB_BY_MODULE:
    pytest.skip(f'no stdlib digest pinned for Python {version}')
  streams = LmData(dataset='stdlib', partition='natural').train_streams
  assert digest(streams) == STDLIB_BY_MODULE[version]
