"""Each client's endless sequence of training rows: epoch after epoch, each epoch in an order
of its own that is a pure function of (seed, client, epoch)."""

import functools

import numpy as np


def epoch_seed(seed: int, client: int, epoch: int) -> int:
  """The 32-bit seed of client `client`'s row order in epoch `epoch` (any ints)."""
  state = np.random.SeedSequence([seed % 2**64, client, epoch % 2**64]).generate_state(1)
  return int(state[0])


# Below this many rows, grain's index_shuffle walks a 2**16-index domain per call (its cost per
# index: docs/benchmarks.md), so a numpy permutation of the rows (at most 512 KiB, a few cached)
# is drawn instead.
SMALL_ROWS = 1 << 16


@functools.lru_cache(maxsize=64)
def _permutation(seed: int, n: int) -> np.ndarray:
  return np.random.default_rng(seed).permutation(n)


def shuffled_rows(seed: int, clients: np.ndarray, positions: np.ndarray,
                  client_rows: np.ndarray) -> np.ndarray:
  """The train row at position `positions` (any ints, same shape as `clients`) of each
  client's endless row sequence: epoch after epoch of its rows, each epoch in an order of its
  own. Large clients use grain's index shuffle, a bijection computed per index (no
  permutation array, so memory does not grow with the corpus); small ones (SMALL_ROWS) a
  cached numpy permutation."""
  from grain.experimental import index_shuffle  # pylint: disable=import-outside-toplevel
  sizes = np.diff(client_rows)
  out = np.empty(np.shape(positions), np.int64)
  seeds: dict[tuple[int, int], int] = {}
  for at, (client, pos) in enumerate(zip(np.ravel(clients).tolist(),
                                         np.ravel(positions).tolist())):
    n = int(sizes[client])
    epoch, within = divmod(pos, n)
    if (client, epoch) not in seeds:
      seeds[client, epoch] = epoch_seed(seed, client, epoch)
    key = seeds[client, epoch]
    row = (int(_permutation(key, n)[within]) if n < SMALL_ROWS else
           index_shuffle(within, max_index=n - 1, seed=key, rounds=4))
    out.flat[at] = client_rows[client] + row
  return out
