"""What a deployed run's rows must equal: the reference executor (paxlike.export.run) on the
cohorts the run's cohorts.jsonl records, each round's batches drawn for that cohort by the data
pipeline and its dropped slots at weight 0 (the simulation's dropped straggler)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from paxlike.export import run as executor


def executor_rounds(task: Any, export: Path, cohorts: list[dict],
                    state: dict[str, np.ndarray] | None = None) -> list[dict[str, np.ndarray]]:
  """The executor's rounds from `state` (the export's own unless given: the state before
  `cohorts[0]`'s round); each round's batches and weights drawn by `task.data` for its row's
  `cohort`, its `dropped_slots` at weight 0."""
  ex = executor.load(export)
  carried, history = dict(ex.carried if state is None else state), []
  for row in cohorts:
    batch, weights = task.data.round_batches(task.train.seed, row['step'],
                                             cohort=np.array(row['cohort']))
    r = row['step'] - ex.plan['start_step'] - 1  # The export's per-round inputs of that round.
    values = {**carried, **{n: a[r] for n, a in ex.rounds.items()}}
    assert {f'batches.{k}' for k in batch} == {n for n in values if n.startswith('batches.')}
    values.update({f'batches.{k}': v for k, v in batch.items()})
    values['weights'] = weights.copy()
    values['weights'][row['dropped_slots']] = 0
    history.append(executor.run_round(ex, values))
    carried = {n: history[-1][n] for n in carried}
  return history


def assert_rows_equal(rows: list[dict], outputs: list[dict[str, np.ndarray]]) -> None:
  """Each row's metrics equal the executor's round's (rtol 1e-5)."""
  for row, out in zip(rows, outputs, strict=True):
    metrics = {n.removeprefix('metrics.'): v for n, v in out.items() if n.startswith('metrics.')}
    assert {'loss', 'accuracy'} <= set(metrics) <= set(row)
    for name, value in metrics.items():
      np.testing.assert_allclose(row[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def assert_rows_within_secagg_bound(task: Any, rows: list[dict], cohorts: list[dict],
                                    outputs: list[dict[str, np.ndarray]]) -> float:
  """Each SecAgg+ row's loss and accuracy equal the executor's round within what quantization
  leaves: FedAvg divides each weighted sum by the weights' sum over the slots held, both off by
  at most the round's `secagg_sum_error_bound`, so a value v is off by at most
  2 × bound / held × (1 + |v|). The last round's bound / held."""
  for row, cohort, out in zip(rows, cohorts, outputs, strict=True):
    _, weights = task.data.round_batches(task.train.seed, cohort['step'],
                                         cohort=np.array(cohort['cohort']))
    held = float(np.delete(weights, cohort['dropped_slots']).sum())
    relative = cohort['secagg_sum_error_bound'] / held
    for name in ('loss', 'accuracy'):
      value = float(out[f'metrics.{name}'])
      assert abs(row[name] - value) <= 2 * relative * (1 + abs(value)) + 1e-6, name
  return relative
