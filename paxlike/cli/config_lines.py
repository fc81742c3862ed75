"""Comment lines about a task that `--mode=print_config` prints and a run records in
config.txt: the model's size, FLOPs and attention kernel (the data's own lines:
DataSource.config_lines)."""

from __future__ import annotations

from paxlike.errors import UserError
from paxlike.trainer.task import Task
from paxlike.families import family_of


def model_summary(task: Task) -> str:
  """The family's `# params: ...`, FLOPs and attention-kernel lines for `--mode=print_config`;
  a model config its layers reject (at trace time) is a UserError, as in training."""
  try:
    return family_of(task.model).summary(task.model, task.data)
  except (ValueError, TypeError) as error:
    raise UserError(f'invalid model config: {str(error).splitlines()[0]}') from None
