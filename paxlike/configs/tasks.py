"""Task building blocks: an experiment picks a model and data, these fill in the rest."""

import fiddle as fdl

from paxlike.configs import meshes, optimizers
from paxlike.trainer.centralized import centralized
from paxlike.trainer.task import Task, TrainConfig


def train_config(num_steps: int, log_every: int = 50, eval_every: int = 200,
                 checkpoint_every: int = 200) -> fdl.Config[TrainConfig]:
  return fdl.Config(TrainConfig, num_steps=num_steps, log_every=log_every,
                    eval_every=eval_every, checkpoint_every=checkpoint_every)


def task(model: fdl.Config, algorithm: fdl.Partial, optimizer: fdl.Config, num_steps: int,
         **train) -> fdl.Config[Task]:
  """A task on a data-parallel mesh; the experiment's `datasets()` fills in its data (and with
  it the cohort shape). `optimizer` is the clients' for federated algorithms; `train` sets
  log/eval/checkpoint intervals. Steps are rounds for federated algorithms."""
  return fdl.Config(Task, model=model, optimizer=optimizer, algorithm=algorithm, data=None,
                    mesh=meshes.data_parallel(), train=train_config(num_steps, **train))


def centralized_task(model: fdl.Config, num_steps: int, peak_lr: float = 3e-3,
                     **train) -> fdl.Config[Task]:
  """Centralized training with AdamW on a warmup-cosine schedule, data-parallel mesh."""
  return task(model, fdl.Partial(centralized), optimizers.adamw(peak_lr), num_steps,
              **train)
