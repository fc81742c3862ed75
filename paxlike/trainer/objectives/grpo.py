"""GRPO (paxlike/trainer/grpo.py) as an objective: `loss=GrpoLoss(...)` on PromptData's
prompts. Its step samples, scores and then updates (grpo_step.py), writing samples.jsonl in
the job dir; its eval is the model's on the held-out answers plus the held-out reward of
greedy completions (grpo_eval.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from paxlike.trainer import grpo, grpo_eval, grpo_step
from paxlike.trainer.grpo_loss import GrpoLoss
from paxlike.trainer.objectives import Objective, register
from paxlike.trainer.objectives.model import model_eval_step


def open_samples(step: grpo_step.GrpoStep, job_dir: Path, start: int, primary: bool) -> None:
  """The step's samples.jsonl in `job_dir`, from the restored step `start` on."""
  step.log.open(job_dir, start, primary)


GRPO = register(Objective(
    name='grpo', loss_type=GrpoLoss, batch_kind='prompts', batch_noun='prompts',
    data_hint='PromptData',
    loss_hint=('GRPO: set loss=GrpoLoss(reward_fns=...) (an experiment that has one: '
               'lm.GrpoTiny)'),
    loss_fn=grpo.grpo_loss_fn, eval_step=model_eval_step, metrics=grpo.METRICS,
    metric_prefixes=('reward/',), check=grpo.check_task, train_step=grpo_step.build,
    held_out=grpo_eval.held_out_reward, open_run=open_samples))
