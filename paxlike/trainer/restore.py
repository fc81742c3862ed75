"""The latest committed state of a job dir, for `--mode=eval`, decoding and export."""

from pathlib import Path
from typing import Any

from paxlike.errors import UserError
from paxlike.experiment import Task
from paxlike.trainer.build import Trainer, setup
from paxlike.trainer.checkpoint import Checkpoints
from paxlike.trainer.train_state import TrainState, ema_params


def load_latest_state(task: Task, job_dir: Path, step: int | None = None, *,
                      evaluator: bool = True) -> tuple[Trainer, int, TrainState]:
  """`task` placed on its mesh without its train step (and with its evaluator unless told
  otherwise), and the latest committed step (or exactly `step`) and its state in `job_dir`."""
  trainer = setup(task, train_step=False, evaluator=evaluator)
  checkpoints = Checkpoints(job_dir / 'checkpoints', task.train.max_to_keep, read_only=True)
  try:
    restored = checkpoints.restore(trainer.program.abstract_state, step)
  finally:
    checkpoints.close()
  if restored is None or (step is not None and restored[0] != step):
    raise UserError(f'no checkpoint in {job_dir / "checkpoints"}; train first' if step is None
                    else f'no committed step {step} in {job_dir / "checkpoints"}')
  found, state, _ = restored
  return trainer, found, state


def export_params(trainer: Trainer, state: TrainState) -> Any:
  """The params to export (or decode): the EMA when the run keeps one (`train.ema_decay`), else
  the trained params. LoRA adapters are still separate (merge with `layers.lora.merge_lora`)."""
  ema = ema_params(state, trainer.program.trainable)
  return state.alg.params if ema is None else ema
