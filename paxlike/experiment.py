"""The experiment base class: what a user writes to describe a run.

An experiment is a small class: `task()` returns a `fdl.Config[Task]` (model, optimizer,
algorithm, mesh, train settings) and `datasets()` returns the data config. `config()` joins
them; that joined config is what `--fdl_set` edits, what `config.json` stores, and what
`fdl.build` turns into a runnable `Task` (paxlike/trainer/task.py, which the trainer runs;
`Task` and `TrainConfig` are importable from here too, as experiments name them).
"""

from __future__ import annotations

import abc

import fiddle as fdl

from paxlike.errors import UserError
from paxlike.trainer.task import Task, TrainConfig

__all__ = ['Experiment', 'Task', 'TrainConfig']


class Experiment(abc.ABC):
  """Subclass, implement `task()` and `datasets()`, and decorate with `@registry.register`."""

  @abc.abstractmethod
  def task(self) -> fdl.Config[Task]:
    """The task config without its data."""

  @abc.abstractmethod
  def datasets(self) -> fdl.Config:
    """The data config (a DataSource)."""

  def config(self) -> fdl.Config[Task]:
    """The full task config: `task()` with `data=datasets()`."""
    cfg = self.task()
    if not isinstance(cfg, fdl.Config):
      raise UserError(f'{type(self).__name__}.task() must return a fdl.Config of '
                      f'paxlike.experiment.Task, got a {type(cfg).__name__}')
    cfg.data = self.datasets()
    return cfg
