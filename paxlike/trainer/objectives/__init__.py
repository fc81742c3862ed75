"""Training objectives: one record per objective (`Objective`) and the one lookup (`for_task`).

An objective is what a task trains its params for: the model's own loss on its batches
(`model.py`), a preference loss on pairs (`preference.py`), GRPO on prompts (`grpo.py`). Its
record says everything the trainer asks of it: the loss, the eval step, any step of its own
(GRPO samples before it updates), the metrics its rows average, whether the params keep a
frozen reference copy, and which kind of batches (`DataSource.batch_kind`) it trains on.

The task's `loss` config picks the objective: the one registered for the config's type (None:
the model's own loss). Every module of this package is imported on the first lookup and
registers its objective (`register`), so a new objective (KTO, RLOO, PPO) is one new module
here and nothing else. This is the only place that decides which objective a task trains.
(A saved config.json naming a loss config class reloads only where the config allow-list,
paxlike/config/allow_list.py, admits the class's module.)
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
from pathlib import Path
from typing import Any, Callable

from paxlike.core.loss import LossFn
from paxlike.errors import UserError

# (task, program, num_groups) -> `step(alg_state, batch, groups)` as evaluation.eval_step's.
EvalStepBuilder = Callable[[Any, Any, int], Callable[..., dict]]
# (task, program) -> (`step(state, batches, weights, rng) -> (state, metrics)`, the program
# its batches are placed by).
TrainStepBuilder = Callable[[Any, Any], tuple[Callable[..., tuple[Any, dict]], Any]]


def _accepts(model: Any, loss: Any, data: Any) -> None:
  """No checks beyond the batch kind."""
  del model, loss, data


def _keeps_no_copy(model: Any, loss: Any) -> bool:
  del model, loss
  return False


@dataclasses.dataclass(frozen=True)
class Objective:
  """What the trainer asks of one training objective (module docstring)."""

  name: str
  loss_type: type          # The `Task.loss` config it trains: type(None) for no config.
  batch_kind: str          # The `DataSource.batch_kind` it trains on.
  batch_noun: str          # What its batches hold, in errors ('prompts').
  data_hint: str           # The data source that gives them, in errors ('PromptData').
  loss_fn: Callable[[Any, Any], LossFn]   # (model, loss config) -> the training loss.
  eval_step: EvalStepBuilder
  # How data of its kind gets this objective, after '<Data> gives <batch_noun>, which train
  # with ' (e.g. "GRPO: set loss=GrpoLoss(...)"); '' where no other objective's loss could be
  # set by mistake (the model's own).
  loss_hint: str = ''
  metrics: tuple[str, ...] = ()          # Step metrics the rows log as means since the last
  metric_prefixes: tuple[str, ...] = ()  # row (besides the loss), by name and by prefix.
  check: Callable[[Any, Any, Any], None] = _accepts  # (model, loss, data): UserError if unfit.
  # (model, loss) -> whether the params keep a frozen copy of themselves (reference.py).
  reference_copy: Callable[[Any, Any], bool] = _keeps_no_copy
  train_step: TrainStepBuilder | None = None  # None: the compiled step on the data's batches.
  # (task, program) -> `fn(params) -> metrics` the eval rows add (GRPO's held-out reward).
  held_out: Callable[[Any, Any], Callable[[Any], dict[str, float]]] | None = None
  # (step, job dir, start step, primary): the step's own files in the job dir, opened before
  # the first step (GRPO's samples.jsonl).
  open_run: Callable[[Any, Path, int, bool], None] | None = None


_REGISTRY: dict[str, Objective] = {}


def register(objective: Objective) -> Objective:
  """Adds `objective` to the registry; ValueError when its name or loss type is taken."""
  for known in _REGISTRY.values():
    if objective.name == known.name or objective.loss_type is known.loss_type:
      raise ValueError(f'objective {objective.name!r} ({objective.loss_type.__name__}) clashes '
                       f'with the registered {known.name!r} ({known.loss_type.__name__})')
  _REGISTRY[objective.name] = objective
  return objective


@functools.cache
def _import_package_modules() -> None:
  """Imports every module of this package (each registers its objective), once."""
  for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f'{__name__}.{module}')


def registry() -> dict[str, Objective]:
  """Every registered objective by name (this package's and any other module's that called
  `register`), this package's modules imported first."""
  _import_package_modules()
  return _REGISTRY


def _of_loss(loss: Any) -> Objective:
  """The objective registered for `loss`'s type (else for a base class of it); UserError for
  a type none trains."""
  matches = [o for o in registry().values() if isinstance(loss, o.loss_type)]
  exact = [o for o in matches if type(loss) is o.loss_type]
  if matches:
    return (exact or matches)[0]
  names = ', '.join(sorted(o.loss_type.__name__ for o in registry().values()
                           if o.loss_type is not type(None)))
  raise UserError(f'Task.loss must be None or one of {names}, got {type(loss).__name__}')


def for_task(loss: Any, data: Any = None) -> Objective:
  """The objective that trains a task with `loss` on `data` (None: not known yet). UserError
  when the data's batches are not the objective's kind: data of another objective's kind
  without a loss says which loss it needs; a loss says which data it needs."""
  objective = _of_loss(loss)
  if data is None or data.batch_kind == objective.batch_kind:
    return objective
  data_name = type(data).__name__
  claimants = [o for o in registry().values()
               if o.batch_kind == data.batch_kind and o.loss_hint]
  if loss is None and claimants:
    raise UserError(f'{data_name} gives {claimants[0].batch_noun}, which train with ' +
                    '; or with '.join(o.loss_hint for o in claimants))
  what = "Task.loss=None (the model's own loss)" if loss is None else type(loss).__name__
  raise UserError(f'{what} trains on {objective.batch_noun}; {data_name} gives none (use '
                  f'{objective.data_hint})')


def of_task(task: Any) -> Objective:
  """`for_task` of a Task's loss and data."""
  return for_task(task.loss, task.data)


def task_loss_fn(model: Any, loss: Any, data: Any = None) -> LossFn:
  """A task's training loss: its objective's (`for_task`), after the objective's checks of
  the model, the loss and the data."""
  objective = for_task(loss, data)
  objective.check(model, loss, data)
  return objective.loss_fn(model, loss)


def mean_metrics(objective: Objective, metrics: dict[str, Any]) -> dict[str, Any]:
  """The entries of a step's `metrics` the rows log as means since the last row: the loss and
  the objective's metrics."""
  names = ('loss', *objective.metrics)
  return {k: v for k, v in metrics.items()
          if k in names or (objective.metric_prefixes and k.startswith(objective.metric_prefixes))}
