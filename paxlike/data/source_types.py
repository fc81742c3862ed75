"""The values a data source gives the trainer: batches, their shapes and dtypes, and how its
pooled eval splits into per-client metrics (`sources.DataSource` promises them)."""

import dataclasses
from typing import Literal, NamedTuple

import numpy as np

# 'inputs', 'targets', 'mask'; packed text adds 'segment_ids' and 'positions', and Poisson cohorts
# or stragglers add STEP_MASK (see DataSource.batch_spec).
Batch = dict[str, np.ndarray]
Item = Literal['tokens', 'examples']  # What a batch's mask counts: LM tokens, or examples.


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


class Spec(NamedTuple):
  """The shape and dtype of one array of a batch."""

  shape: tuple[int, ...]
  dtype: np.dtype


class BatchSpec(NamedTuple):
  """What a round holds, without building one: `round` the batches (leading [slots,
  local_steps, rows]), `weights` the cohort's [slots], `eval` one eval batch (leading [rows])."""

  round: dict[str, Spec]
  weights: Spec
  eval: dict[str, Spec]


def spec_of(batch: Batch) -> dict[str, Spec]:
  """The specs of a built batch's arrays (what `batch_spec` promises)."""
  return {k: Spec(tuple(v.shape), np.dtype(v.dtype)) for k, v in batch.items()}
