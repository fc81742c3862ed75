"""The model's own objective: no `Task.loss` config, the model's loss (paxlike/trainer/
losses.py) on the data's sequences or examples, and the pooled and per-client eval
(evaluation.eval_step)."""

from __future__ import annotations

from typing import Any, Callable

from paxlike.core.loss import LossFn
from paxlike.trainer import evaluation, losses
from paxlike.trainer.objectives import Objective, register


def model_eval_step(task: Any, program: Any, num_groups: int) -> Callable[..., dict]:
  """evaluation.eval_step of the task's model and data item, with the algorithm's ensemble."""
  return evaluation.eval_step(task.model, task.data.item, num_groups, program.algorithm.ensemble)


def own_loss_fn(model: Any, loss: None) -> LossFn:
  """losses.model_loss_fn of `model` (there is no loss config)."""
  del loss
  return losses.model_loss_fn(model)


MODEL = register(Objective(
    name='model', loss_type=type(None), batch_kind='sequences', batch_noun='sequences',
    data_hint='a source of sequences or examples, e.g. LmData',
    loss_fn=own_loss_fn, eval_step=model_eval_step,
    metrics=('accuracy',)))
