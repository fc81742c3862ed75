"""The latest committed state of a job dir, for `--mode=eval`, decoding and export."""

from pathlib import Path

from paxlike.checkpoint import Checkpoints
from paxlike.errors import UserError
from paxlike.experiment import Task
from paxlike.train_state import TrainState
from paxlike.trainer_setup import Setup, setup


def load_latest_state(task: Task, job_dir: Path) -> tuple[Setup, int, TrainState]:
  """`task` placed on its mesh, and the latest committed step and state in `job_dir`."""
  placed = setup(task)
  checkpoints = Checkpoints(job_dir / 'checkpoints', task.train.max_to_keep, read_only=True)
  try:
    restored = checkpoints.restore(placed.abstract_state)
  finally:
    checkpoints.close()
  if restored is None:
    raise UserError(f'no checkpoint in {job_dir / "checkpoints"}; train first')
  step, state, _ = restored
  return placed, step, state
