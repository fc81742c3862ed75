"""The protocol the trainer consumes, and helpers shared by the LM and image sources."""

from collections.abc import Sequence
import dataclasses
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from paxlike.errors import UserError

Batch = dict[str, np.ndarray]  # Exactly the keys 'inputs', 'targets', 'mask'.
SAMPLINGS = ('uniform', 'weighted', 'fixed')
Item = Literal['tokens', 'examples']  # What a batch's mask counts: LM tokens, or examples.

# Distinct streams so that the cohort of a round does not depend on batch shapes.
COHORT_STREAM, EXAMPLE_STREAM = 0, 1


@dataclasses.dataclass(frozen=True)
class ClientEval:
  """How the pooled eval splits into per-client held-out metrics.

  Every eval target is in one group: `groups[i]` has the shape of eval batch i's mask (-1: in
  no group). Client c's metric is the `mix[c]`-weighted sum over groups of each group's mean,
  e.g. groups = LM clients and mix = identity (each client's own held-out text), or groups =
  classes and mix = each client's training label distribution (the test set reweighted to the
  client's label mix, exactly in expectation).
  """

  names: tuple[str, ...]
  groups: list[np.ndarray]
  mix: np.ndarray  # float64 [clients, num_groups], rows sum to 1.

  @property
  def num_groups(self) -> int:
    return self.mix.shape[1]


@runtime_checkable
class DataSource(Protocol):
  """Per-round batches for the trainer; centralized training is 1 client x 1 local step."""

  item: Item
  clients_per_round: int
  local_steps: int
  batch_size: int

  def round_batches(self, seed: int, step: int, clients: slice = slice(None),
                    rows: slice = slice(None)) -> tuple[Batch, np.ndarray]:
    """Batches with leading axes [clients_per_round, local_steps, batch_size, ...], cut to
    cohort slots `clients` and batch rows `rows` (one process's block), and the whole cohort's
    weights [clients_per_round] float32; a pure function of (seed, step), so a block equals
    the same slice of the whole."""
    ...

  def eval_batches(self, rows: slice = slice(None)) -> list[Batch]:
    """Pooled held-out data, fixed and deterministic, each leading [eval_batch_size, ...] (cut
    to rows `rows`: one process's block)."""
    ...

  def client_eval(self) -> ClientEval | None:
    """The per-client split of `eval_batches()`, or None where clients have no held-out data
    of their own (e.g. IID or pooled partitions)."""
    ...


def round_rng(seed: int, step: int, stream: int) -> np.random.Generator:
  """The generator for (seed, step, stream); any ints, negative ones included."""
  return np.random.default_rng([stream, seed % 2**64, step % 2**64])


def sample_cohort(seed: int, step: int, sizes: np.ndarray, k: int, sampling: str) -> np.ndarray:
  """`k` distinct client indices for round `step`: uniformly, with probability proportional to
  size ('weighted'), or 'fixed': clients 0..k-1 in order every round, so slot i is always
  client i (DiLoCo replicas, PAPA members, BTM experts keep their data)."""
  if sampling == 'fixed':
    return np.arange(k, dtype=np.int64)
  rng = round_rng(seed, step, COHORT_STREAM)
  p = sizes / sizes.sum() if sampling == 'weighted' else None
  return rng.choice(len(sizes), size=k, replace=False, p=p)


def cohort_weights(sizes: np.ndarray, cohort: np.ndarray, sampling: str) -> np.ndarray:
  """FedAvg weights: the clients' sizes under uniform and fixed sampling; ones under
  size-weighted sampling (which already favours large clients, so size weights would count
  them twice)."""
  if sampling == 'weighted':
    return np.ones(len(cohort), np.float32)
  return sizes[cohort].astype(np.float32)


def check_fields(obj: object, positive: Sequence[str], choices: dict[str, Sequence[str]]) -> None:
  """Raises a one-line UserError if a named field is not a positive int or not a valid choice."""
  name = type(obj).__name__
  for field in positive:
    value = getattr(obj, field)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
      raise UserError(f'{name}.{field} must be a positive int, got {value!r}')
  for field, allowed in choices.items():
    if getattr(obj, field) not in allowed:
      raise UserError(f'{name}.{field} must be one of {", ".join(allowed)}; '
                      f'got {getattr(obj, field)!r}')


def check_cohort(obj: object, num_clients: int) -> None:
  """A cohort is drawn without replacement, so it cannot exceed the client count; a fixed
  cohort is every client (a client never trained is a config mistake)."""
  k = getattr(obj, 'clients_per_round')
  if getattr(obj, 'sampling') == 'fixed' and k != num_clients:
    raise UserError(f"{type(obj).__name__}: sampling='fixed' trains every client each round, "
                    f'so clients_per_round={k} must equal the {num_clients} clients')
  if k > num_clients:
    raise UserError(f'{type(obj).__name__}.clients_per_round={k} exceeds the '
                    f'{num_clients} clients available')


def size_stats(sizes: np.ndarray) -> dict[str, float | int]:
  """Client count and min/median/max/total of per-client sizes."""
  return {'num_clients': int(len(sizes)), 'min': int(sizes.min()),
          'median': float(np.median(sizes)), 'max': int(sizes.max()),
          'total': int(sizes.sum())}
