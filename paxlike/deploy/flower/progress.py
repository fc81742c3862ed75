"""What a deployed run keeps in its out dir so that a restarted ServerApp resumes: Orbax
checkpoints of the server state (paxlike's `Checkpoints`, one per round) and the trainer's
`metrics.jsonl` rows (`RunWriter`: rows after the restored step are dropped on resume, so a
ServerApp killed between a row and its checkpoint rewrites that row instead of repeating it).

A checkpoint's metadata holds what the round loop needs besides the state: the clients' sizes
(what cohorts are sampled from), the clients lost with their nodes so far, each slot's client
state version, and the metric sums the trainer carries between rows.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np

from paxlike.trainer import summaries
from paxlike.trainer.checkpoint import Checkpoints

_KEEP = 2  # Checkpoints kept: the newest, and the one before in case the newest is torn.


@dataclasses.dataclass
class Resumed:
  """Where the run starts: the step done, its state and its metadata (empty when fresh)."""

  step: int
  state: dict[str, np.ndarray]
  meta: dict[str, Any]


def open_checkpoints(out: Path) -> Checkpoints:
  return Checkpoints(out / 'checkpoints', _KEEP)


def resume(checkpoints: Checkpoints, start_step: int, initial: dict[str, np.ndarray],
           step: int | None = None) -> Resumed:
  """The latest committed checkpoint's state (at or before `step`, when given), or the export's
  `initial` state at `start_step`."""
  abstract = {n: jax.ShapeDtypeStruct(v.shape, v.dtype) for n, v in initial.items()}
  restored = checkpoints.restore(abstract, step)
  if restored is None:
    return Resumed(start_step, dict(initial), {})
  step, state, meta = restored
  return Resumed(step, {n: np.asarray(v) for n, v in state.items()}, meta)


def save(checkpoints: Checkpoints, step: int, state: dict[str, np.ndarray],
         sizes: np.ndarray, lost: list[int], state_versions: list[int] | None = None) -> None:
  """Starts the async save of round `step`'s state with what a resume needs besides it (the
  version of each slot's client state, which the nodes keep: slot_versions.py)."""
  checkpoints.save(step, state, {'step': step, 'sizes': [int(s) for s in sizes],
                                 'lost_clients': sorted(lost),
                                 'state_versions': [int(v) for v in state_versions or []]})


class Rows:
  """The run's metrics.jsonl (the trainer's rows: `step`, the round's metrics without the
  export's `metrics.` prefix, `steps_per_sec`) and cohorts.jsonl (each round's cohort, the
  slots it dropped and the nodes that took part), both cut back to `start` on resume."""

  def __init__(self, out: Path, start: int, last: int):
    self.writer = summaries.RunWriter(out, start, last)
    self.cohorts = out / 'cohorts.jsonl'
    summaries.truncate_after(self.cohorts, start)

  def write(self, step: int, outputs: dict[str, np.ndarray], extra: dict[str, Any],
            cohort: dict[str, Any], evals: tuple[dict, dict] | None = None) -> dict[str, Any]:
    """The row of round `step` (`evals`: its held-out metrics and per-client table, written
    as the trainer writes them: `eval_*` fields and clients.jsonl)."""
    metrics = {n.removeprefix('metrics.'): v for n, v in outputs.items()
               if n.startswith('metrics.') and np.size(v) == 1}
    rate = self.writer.steps_per_sec(step)
    row = self.writer.write(step, {**metrics, **extra, 'steps_per_sec': rate},
                            *(evals or (None, None)))
    with open(self.cohorts, 'a') as f:
      f.write(json.dumps({'step': step, **cohort}) + '\n')
    return row

  def close(self) -> None:
    self.writer.close()
