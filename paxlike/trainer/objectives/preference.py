"""Preference tuning (DPO, IPO, SimPO, ORPO: paxlike/trainer/preference.py) as an objective:
`loss=PreferenceLoss(...)` on PreferenceData's pair batches, evaluated on the held-out pairs;
a full fine-tune of a kind with a reference keeps a frozen copy of the params (reference.py)."""

from __future__ import annotations

from typing import Any, Callable

from paxlike.trainer import preference, reference
from paxlike.trainer.objectives import Objective, register
from paxlike.trainer.preference_loss import METRICS, PreferenceLoss


def pair_eval_step(task: Any, program: Any, num_groups: int) -> Callable[..., dict]:
  """preference.eval_step of the task's model and loss (pairs have no ensemble)."""
  del program
  return preference.eval_step(task.model, task.loss, num_groups)


PREFERENCE = register(Objective(
    name='preference', loss_type=PreferenceLoss, batch_kind='pairs',
    batch_noun='preference pairs', data_hint='PreferenceData',
    loss_hint=("a preference loss: set loss=PreferenceLoss(kind='dpo', ...) (--fdl_set="
               'loss.kind=dpo on an experiment that has one, e.g. lm.DpoTiny)'),
    loss_fn=preference.preference_loss_fn, eval_step=pair_eval_step, metrics=METRICS,
    reference_copy=reference.needs_copy))
