"""The contract the trainer consumes (`DataSource`), and helpers shared by the sources."""

from collections.abc import Sequence
import abc
import functools
import math
from typing import Any, ClassVar

import numpy as np

from paxlike.core.batch import STEP_MASK  # Which local steps each slot runs (see there).
# What sources give, named here too (sources.Batch, sources.Spec, ...): source_types.py.
from paxlike.data.source_types import Batch, BatchSpec, ClientEval, Item, Spec, spec_of
from paxlike.errors import RunFailure, UserError

SAMPLINGS = ('uniform', 'weighted', 'fixed')
# With Poisson cohorts: for the sources whose round batches pad its unused slots (images, LM).
PADDED_SAMPLINGS = (*SAMPLINGS, 'poisson')
PADDED = -1  # A Poisson cohort's unused slot (weight 0, mask 0).
# A Poisson cohort's slots: at least mean + 8 sd, and overflowing with probability at most this
# per round (the exact binomial tail; for a mean of 1 client, 8 sd alone is ~1e-7).
POISSON_OVERFLOW = 1e-12

# Distinct streams so that the cohort of a round does not depend on batch shapes, and turning
# stragglers on changes neither the cohort nor the examples.
COHORT_STREAM, EXAMPLE_STREAM, STRAGGLER_STREAM = 0, 1, 2


class DataSource(abc.ABC):
  """Per-round batches for the trainer; centralized training is 1 client x 1 local step.

  Sources are dataclasses with the fields annotated here. What only some sources have is
  declared here with its default, so the trainer asks every source the same way: `num_slots`,
  `vocab_size`, `loaded_tokenizer`, `fingerprint()`, `config_lines()`, `batch_kind`. `prepare()` is
  the one step that reads or builds the data (a corpus's token store and packing plan, a
  dataset's arrays); the trainer calls it once, before it asks for `batch_spec()`.

  Client questions are the source's own: `client_sizes` (and so the number of clients, its
  length) and `cohort(seed, step, live)`, the one rule that draws a round's clients, which
  `round_batches`, a deployment's apps and the privacy accountant all ask.
  """

  item: ClassVar[Item]
  # What a batch holds, and so which loss trains on it: 'sequences' (the model's own loss),
  # 'pairs' (preference pairs, two rows each: a preference loss) or 'prompts' (GRPO's).
  batch_kind: ClassVar[str] = 'sequences'
  clients_per_round: int
  local_steps: int
  batch_size: int
  eval_batch_size: int
  sampling: str
  partition: str
  straggler_fraction: float = 0.0  # Sources without stragglers keep this default.

  @abc.abstractmethod
  def prepare(self) -> None:
    """Reads (building it the first time, under a lock) what the batches come from."""

  @abc.abstractmethod
  def row_spec(self) -> dict[str, Spec]:
    """The arrays of one row of a batch: shapes without the leading batch axes."""

  @property
  @abc.abstractmethod
  def client_sizes(self) -> np.ndarray:
    """int [clients]: each training client's size in what it is weighted by (examples,
    training tokens, pairs), by client id; pooled data is one client. What 'weighted' cohorts
    draw by and FedAvg weighs by; its length is the number of clients (a DP run's population,
    a deployment's clients). Reads the data the first time."""

  @property
  def pooled(self) -> bool:
    """Whether the data is one pool (client 0) that every cohort slot reads rows of."""
    return self.partition == 'pooled'

  def cohort(self, seed: int, step: int, live: Sequence[int] | None = None,
             sizes: np.ndarray | None = None) -> np.ndarray:
    """int64 [num_slots]: round `step`'s client in each cohort slot (PADDED: none), the one
    rule rounds are drawn by. Pooled data: client 0 in every slot; else `sample_cohort` by
    `sampling` among the clients. `live` (a deployment's clients still reachable; None: all)
    restricts the draw, so that all live gives the same cohort (pooled: every slot PADDED once
    client 0 is lost). `sizes` (None: `client_sizes`): the sizes to draw by where they are
    known without the data (a Flower server's, reported by its nodes)."""
    k = self.clients_per_round
    if self.pooled:
      return np.full(k, 0 if live is None or 0 in live else PADDED, np.int64)
    sizes = self.client_sizes if sizes is None else np.asarray(sizes)
    return sample_cohort(seed, step, sizes, k, self.sampling, live)

  def round_cohort(self, seed: int, step: int,
                   cohort: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """The cohort `round_batches` draws for: `cohort` when one is given (checked,
    `checked_cohort`), else the round's own, `cohort(seed, step)`."""
    return self.cohort(seed, step) if cohort is None else checked_cohort(self, cohort)

  @abc.abstractmethod
  def round_batches(self, seed: int, step: int, clients: slice = slice(None),
                    rows: slice = slice(None), cohort: np.ndarray | None = None
                    ) -> tuple[Batch, np.ndarray]:
    """Batches with leading axes [slots, local_steps, rows, ...], cut to cohort slots
    `clients` and batch rows `rows` (one process's block), and the whole cohort's weights
    [slots] float32; a pure function of (seed, step), so a block equals the same slice of the
    whole. slots = `num_slots`: clients_per_round, or under 'poisson' sampling a cap whose
    unused slots have weight 0 and mask 0. `cohort` (each slot's client id or PADDED,
    `checked_cohort`) replaces the round's sampled cohort: the batches are drawn for it in the
    same order (a deployment that re-draws the cohort among the clients it still reaches)."""

  @abc.abstractmethod
  def eval_batches(self, rows: slice = slice(None)) -> list[Batch]:
    """Pooled held-out data, fixed and deterministic, each leading [rows, ...] (cut to rows
    `rows`: one process's block)."""

  @abc.abstractmethod
  def describe(self) -> dict[str, Any]:
    """Statistics of the data and its clients (--mode=describe_data)."""

  def client_eval(self) -> ClientEval | None:
    """The per-client split of `eval_batches()`; None where clients have no held-out data of
    their own (e.g. IID or pooled partitions)."""
    return None

  @property
  def num_slots(self) -> int:
    """The cohort slots a round's batches lead with: clients_per_round, or under 'poisson'
    sampling of clients (pooled data has none to draw) `poisson_slots` of them."""
    if self.sampling != 'poisson' or self.pooled:
      return self.clients_per_round
    return poisson_slots(len(self.client_sizes), self.clients_per_round)

  @property
  def rows_per_item(self) -> int:
    """Batch rows per `batch_size` unit: 2 for preference pairs, else 1."""
    return 2 if self.batch_kind == 'pairs' else 1

  @property
  def marks_steps(self) -> bool:
    """Whether batches carry STEP_MASK (which local steps each slot runs)."""
    return self.sampling == 'poisson' or bool(self.straggler_fraction)

  def batch_spec(self) -> BatchSpec:
    """The shapes and dtypes of a round's batches and weights and of an eval batch."""
    row = self.row_spec()
    lead = (self.num_slots, self.local_steps, self.batch_size * self.rows_per_item)
    batches = {k: Spec(lead + s.shape, s.dtype) for k, s in row.items()}
    if self.marks_steps:
      batches[STEP_MASK] = Spec(lead, np.dtype(np.float32))
    eval_rows = (self.eval_batch_size * self.rows_per_item,)
    return BatchSpec(batches, Spec(lead[:1], np.dtype(np.float32)),
                     {k: Spec(eval_rows + s.shape, s.dtype) for k, s in row.items()})

  @property
  def vocab_size(self) -> int | None:
    """The token ids' range (None: not token data)."""
    return None

  @property
  def loaded_tokenizer(self) -> Any:
    """The tokenizer of text data (paxlike.tokenizers); None for other data."""
    return None

  def fingerprint(self) -> dict[str, str] | None:
    """{'dataset', 'source', 'sha256'}: the job dir's record of what the data was read from
    (a resume on changed data is refused); None when there is nothing to record."""
    return None

  def config_lines(self) -> str:
    """Lines for config.txt and --mode=print_config about how the data is laid out (e.g.
    packing efficiency), '' if none."""
    return ''


def round_rng(seed: int, step: int, stream: int) -> np.random.Generator:
  """The generator for (seed, step, stream); any ints, negative ones included."""
  return np.random.default_rng([stream, seed % 2**64, step % 2**64])


def poisson_slots(population: int, k: int) -> int:
  """The fixed slot count of a Poisson cohort (each of `population` clients joins with
  probability q = k / population): the larger of mean + 8 sd and the binomial tail quantile
  at POISSON_OVERFLOW, at most population (then it cannot overflow)."""
  from scipy import stats  # Only Poisson cohorts pay for the import.
  q = k / population
  bound = max(math.ceil(k + 8 * math.sqrt(k * (1 - q))),
              int(stats.binom.isf(POISSON_OVERFLOW, population, q)))
  return min(population, bound)


def poisson_cohort(seed: int, step: int, population: int, k: int) -> np.ndarray:
  """int64 [poisson_slots]: round `step`'s clients, each in independently with probability
  k / population, in increasing order, then PADDED. RunFailure (never truncation) if more
  join than there are slots."""
  rng = round_rng(seed, step, COHORT_STREAM)
  joined = np.flatnonzero(rng.random(population) < k / population)
  slots = _cached_slots(population, k)
  if len(joined) > slots:
    raise RunFailure(f'round {step}: {len(joined)} clients joined the Poisson cohort, more than '
                     f'its {slots} slots (probability < {POISSON_OVERFLOW:g} a round)')
  return np.concatenate([joined, np.full(slots - len(joined), PADDED, np.int64)])


_cached_slots = functools.lru_cache(maxsize=64)(poisson_slots)


def sample_cohort(seed: int, step: int, sizes: np.ndarray, k: int, sampling: str,
                  live: Sequence[int] | None = None) -> np.ndarray:
  """Client indices for round `step`'s slots: `k` distinct ones uniformly, with probability
  proportional to size ('weighted'), or 'fixed': clients 0..k-1 in order every round, so slot i
  is always client i (DiLoCo replicas, PAPA members, BTM experts keep their data); 'poisson':
  see `poisson_cohort` (PADDED in unused slots).

  `live` (a deployment's clients still reachable; None: all) restricts the draw to those
  clients, with the same stream, so that all clients live gives exactly the cohort without
  `live`: uniform and weighted draw `k` among them (fewer live: all of them, then PADDED),
  'poisson' keeps the joiners that are live, 'fixed' puts PADDED in a lost client's slot."""
  if live is not None:
    return _live_cohort(seed, step, sizes, k, sampling, np.unique(np.asarray(live, np.int64)))
  if sampling == 'fixed':
    return np.arange(k, dtype=np.int64)
  if sampling == 'poisson':
    return poisson_cohort(seed, step, len(sizes), k)
  rng = round_rng(seed, step, COHORT_STREAM)
  p = sizes / sizes.sum() if sampling == 'weighted' else None
  return rng.choice(len(sizes), size=k, replace=False, p=p)


def _live_cohort(seed: int, step: int, sizes: np.ndarray, k: int, sampling: str,
                 live: np.ndarray) -> np.ndarray:
  """`sample_cohort` among the sorted client ids `live` only."""
  if len(live) and (live[0] < 0 or live[-1] >= len(sizes)):
    raise UserError(f'live clients must be ids in [0, {len(sizes)}), got {live.tolist()}')
  if sampling == 'fixed':
    return np.where(np.isin(np.arange(k), live), np.arange(k), PADDED).astype(np.int64)
  if sampling == 'poisson':
    joined = poisson_cohort(seed, step, len(sizes), k)
    kept = joined[np.isin(joined, live)]
    return np.concatenate([kept, np.full(len(joined) - len(kept), PADDED, np.int64)])
  rng = round_rng(seed, step, COHORT_STREAM)
  drawn = min(k, len(live))
  p = sizes[live] / sizes[live].sum() if sampling == 'weighted' and drawn else None
  chosen = live[rng.choice(len(live), size=drawn, replace=False, p=p)] if drawn else live
  return np.concatenate([chosen, np.full(k - drawn, PADDED, np.int64)]).astype(np.int64)


def checked_cohort(source: DataSource, cohort: Sequence[int] | np.ndarray) -> np.ndarray:
  """`cohort` as int64 when it can be `source`'s round: `num_slots` entries, each a client id
  among its `client_sizes` or PADDED, the clients distinct unless the data is pooled (every
  slot then reads client 0); else a one-line UserError."""
  array = np.asarray(cohort)
  name, slots, population = type(source).__name__, source.num_slots, len(source.client_sizes)
  if (array.shape != (slots,) or not (array.size == 0 or np.issubdtype(array.dtype, np.integer))
      or ((array < PADDED) | (array >= population)).any()):
    raise UserError(f'{name}: a cohort must be {slots} client ids in [0, {population}) or '
                    f'{PADDED} (padded), got {np.asarray(cohort).tolist()}')
  real = array[array != PADDED]
  if not source.pooled and len(np.unique(real)) != len(real):
    raise UserError(f'{name}: a cohort holds each client at most once, got {array.tolist()}')
  return array.astype(np.int64)


def cohort_weights(sizes: np.ndarray, cohort: np.ndarray, sampling: str) -> np.ndarray:
  """FedAvg weights: the clients' sizes under uniform, fixed and Poisson sampling (0 in PADDED
  slots); ones under size-weighted sampling (which already favours large clients, so size
  weights would count them twice)."""
  if sampling == 'weighted':
    return np.ones(len(cohort), np.float32)
  return np.where(cohort == PADDED, 0, sizes[np.maximum(cohort, 0)]).astype(np.float32)


def straggler_steps(seed: int, step: int, present: np.ndarray, local_steps: int,
                    fraction: float) -> np.ndarray:
  """int64 [slots]: the local steps each slot runs in round `step`. A client slot (`present`)
  straggles with probability `fraction` and then runs a uniform number in [1, local_steps),
  else all `local_steps`; a padded slot runs none. Slot i's draws are the i-th of the round's
  stream, so they depend on (seed, step, i) alone."""
  draws = round_rng(seed, step, STRAGGLER_STREAM).random((len(present), 2))
  straggles = draws[:, 0] < fraction
  partial = 1 + np.floor(draws[:, 1] * max(local_steps - 1, 0)).astype(np.int64)
  return np.where(present, np.where(straggles, partial, local_steps), 0).astype(np.int64)


def mark_steps(batch: Batch, steps: np.ndarray, clients: slice = slice(None)) -> Batch:
  """`batch` (slots `clients` of a round's) with its STEP_MASK from each slot's `steps` (all
  slots') and the items of the steps a slot does not run masked out."""
  mask = batch['mask']
  runs = np.arange(mask.shape[1])[None, :] < steps[clients, None]  # [block slots, local_steps]
  step_mask = np.broadcast_to(runs[:, :, None], mask.shape[:3]).astype(np.float32)
  return {**batch, 'mask': (mask * runs.reshape(*runs.shape, *[1] * (mask.ndim - 2))
                            ).astype(np.float32), STEP_MASK: step_mask}


def with_step_mask(source: DataSource, batch: Batch, seed: int, step: int, cohort: np.ndarray,
                   clients: slice = slice(None)) -> Batch:
  """`batch` as `source` gives it: with a STEP_MASK under Poisson sampling or stragglers
  (`marks_steps`), else unchanged."""
  if not source.marks_steps:
    return batch
  steps = straggler_steps(seed, step, cohort != PADDED, source.local_steps,
                          source.straggler_fraction)
  return mark_steps(batch, steps, clients)


def check_stragglers(source: DataSource) -> None:
  """`straggler_fraction` is a number in [0, 1), and a straggler needs 2+ local steps to run
  fewer than all of them."""
  name, value = type(source).__name__, source.straggler_fraction
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
    raise UserError(f'{name}.straggler_fraction must be a number in [0, 1), got {value!r}')
  if value and source.local_steps < 2:
    raise UserError(f'{name}.straggler_fraction={value} needs local_steps >= 2 (a straggler '
                    f'runs 1 to local_steps - 1 of them), got local_steps={source.local_steps}')


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


def check_cohort(source: DataSource, population: int) -> None:
  """A cohort is drawn without replacement, so it cannot exceed the client count; a fixed
  cohort is every client (a client never trained is a config mistake)."""
  k = source.clients_per_round
  if source.sampling == 'fixed' and k != population:
    raise UserError(f"{type(source).__name__}: sampling='fixed' trains every client each round, "
                    f'so clients_per_round={k} must equal the {population} clients')
  if k > population:
    raise UserError(f'{type(source).__name__}.clients_per_round={k} exceeds the '
                    f'{population} clients available')


def size_stats(sizes: np.ndarray) -> dict[str, float | int]:
  """The population (the clients the source has; `data.num_clients` is the config field that
  asks a partition for some) and min/median/max/total of per-client sizes."""
  return {'population': int(len(sizes)), 'min': int(sizes.min()),
          'median': float(np.median(sizes)), 'max': int(sizes.max()),
          'total': int(sizes.sum())}
