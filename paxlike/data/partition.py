"""Client partitions of a training set: each returns one sorted int64 index array per client.

Every function is a pure function of its inputs (and `seed`); every example lands in exactly
one client.
"""

from collections.abc import Sequence

import numpy as np


def client_sizes(parts: Sequence[np.ndarray]) -> np.ndarray:
  """Examples per client (int64): the FedAvg weights."""
  return np.array([len(p) for p in parts], dtype=np.int64)


def natural(client_ids: Sequence) -> list[np.ndarray]:
  """One client per distinct id, in `np.unique(client_ids)` order."""
  ids = np.asarray(client_ids)
  _, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
  order = np.argsort(inverse, kind='stable')
  return np.split(order.astype(np.int64), np.cumsum(counts)[:-1])


def contiguous_groups(sizes: Sequence[int], k: int) -> list[np.ndarray]:
  """Items 0..n-1 (in order) cut into `k` non-empty contiguous runs of near-equal total size:
  each cut sits at the item boundary nearest to a multiple of total/k."""
  sizes = np.asarray(sizes, np.int64)
  n = len(sizes)
  if not 1 <= k <= n:
    raise ValueError(f'cannot cut {n} items into {k} non-empty groups')
  ends = np.cumsum(sizes)  # ends[i]: total size of items 0..i.
  bounds = np.concatenate([[0], ends])  # bounds[c]: total size before cut c.
  cuts = [0]
  for j in range(1, k):
    nearest = int(np.argmin(np.abs(bounds - ends[-1] * j / k)))
    cuts.append(min(max(nearest, cuts[-1] + 1), n - (k - j)))  # Keep every group non-empty.
  return np.split(np.arange(n, dtype=np.int64), cuts[1:])


def domains(client_ids: Sequence, example_sizes: Sequence[int], k: int) -> list[np.ndarray]:
  """Natural clients grouped into `k` domains: clients ordered by their first example (source
  order), then cut into contiguous runs of near-equal total `example_sizes`. No seed: a pure
  function of the data. Every natural client lands whole in one domain."""
  clients = natural(client_ids)
  order = np.argsort([p[0] for p in clients], kind='stable')
  sizes = np.asarray(example_sizes, np.int64)
  totals = [sizes[clients[c]].sum() for c in order]
  return [np.sort(np.concatenate([clients[order[i]] for i in group]))
          for group in contiguous_groups(totals, k)]


def iid(num_examples: int, num_clients: int, seed: int) -> list[np.ndarray]:
  """A random permutation cut into `num_clients` near-equal parts."""
  perm = np.random.default_rng(seed).permutation(num_examples)
  return [np.sort(p) for p in np.array_split(perm, num_clients)]


def shards(labels: Sequence[int], num_clients: int, shards_per_client: int,
           seed: int) -> list[np.ndarray]:
  """McMahan et al. (2017) pathological non-IID: sort by label, cut into
  `num_clients * shards_per_client` near-equal shards, deal each client random shards.

  A client sees at most `shards_per_client` labels when class sizes are multiples of the
  shard size (e.g. Fashion-MNIST, 100 clients x 2); otherwise a shard may straddle two labels.
  """
  order = np.argsort(np.asarray(labels), kind='stable').astype(np.int64)
  pieces = np.array_split(order, num_clients * shards_per_client)
  deal = np.random.default_rng(seed).permutation(len(pieces)).reshape(num_clients, -1)
  return [np.sort(np.concatenate([pieces[s] for s in row])) for row in deal]


def similarity(labels: Sequence[int], num_clients: int, fraction: float,
               seed: int) -> list[np.ndarray]:
  """Karimireddy et al. (2020, SCAFFOLD) s% similarity: a random `fraction` of the examples is
  dealt IID to the clients, the rest is sorted by label and cut into one contiguous piece per
  client, in client order. 0: label-sorted clients (one or two labels each when they are fewer
  than the clients); 1: IID."""
  labels = np.asarray(labels)
  perm = np.random.default_rng(seed).permutation(len(labels)).astype(np.int64)
  shared, rest = np.split(perm, [round(fraction * len(labels))])
  ordered = rest[np.argsort(labels[rest], kind='stable')]
  return [np.sort(np.concatenate([a, b])) for a, b in
          zip(np.array_split(shared, num_clients), np.array_split(ordered, num_clients))]


def _class_counts_per_client(rng: np.random.Generator, class_counts: np.ndarray,
                             capacity: np.ndarray, q: np.ndarray) -> np.ndarray:
  """Integer [clients, classes] counts with row sums `capacity` and column sums
  `class_counts`, drawn from each client's class proportions `q` renormalised over the
  classes not yet used up (oversubscribed classes are shared out hypergeometrically)."""
  counts = np.zeros(q.shape, dtype=np.int64)
  remaining, capacity = class_counts.astype(np.int64), capacity.astype(np.int64)
  while capacity.sum() > 0:
    avail = remaining > 0
    w = q * avail
    empty = np.flatnonzero(w.sum(axis=1) <= 0)
    # A client whose classes are all used up moves on to one remaining class (by size).
    pick = rng.choice(len(remaining), size=len(empty), p=remaining / remaining.sum())
    w[empty] = 0.0
    w[empty, pick] = 1.0
    w /= w.sum(axis=1, keepdims=True)
    demand = rng.multinomial(capacity, w)
    for k in np.flatnonzero(demand.sum(axis=0) > remaining):
      demand[:, k] = rng.multivariate_hypergeometric(demand[:, k], remaining[k])
    counts += demand
    capacity -= demand.sum(axis=1)
    remaining -= demand.sum(axis=0)
  return counts


def dirichlet(labels: Sequence[int], num_clients: int, alpha: float,
              seed: int) -> list[np.ndarray]:
  """Hsu et al. (2019) label skew: equal-size clients whose class proportions are drawn
  from Dir(alpha * p), p the overall class distribution. Small alpha: few classes per
  client; large alpha: close to IID. Proportions are renormalised over the classes left once
  a class is used up, so the clients exactly partition the data."""
  labels = np.asarray(labels)
  _, y = np.unique(labels, return_inverse=True)
  class_counts = np.bincount(y)
  rng = np.random.default_rng(seed)
  prior = class_counts / len(y)
  q = np.nan_to_num(rng.dirichlet(alpha * prior, size=num_clients))
  capacity = np.full(num_clients, len(y) // num_clients)
  capacity[:len(y) % num_clients] += 1
  counts = _class_counts_per_client(rng, class_counts, capacity, q)
  per_client: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
  for k in range(len(class_counts)):
    members = rng.permutation(np.flatnonzero(y == k))
    for c, piece in enumerate(np.split(members, np.cumsum(counts[:, k])[:-1])):
      per_client[c].append(piece)
  return [np.sort(np.concatenate(p)).astype(np.int64) for p in per_client]
