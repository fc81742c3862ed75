"""In-process tiny LM tasks for the fine-tuning tests (init_from, LoRA, EMA)."""

import dataclasses

import fiddle as fdl

from paxlike.configs import fiddlers
from paxlike import registry
from paxlike.config import config_io
from paxlike.trainer import build
from paxlike.trainer.checkpoint import Checkpoints
from paxlike.trainer.task import Task

# lm.StdlibTiny's model at test size: 1 layer, d_model 32, seq 16, batch 4.
SMALL = ['data.seq_len=16', 'data.batch_size=4', 'model.d_model=32', 'model.d_ff=64']


def tiny_config(*overrides: str) -> fdl.Config[Task]:
  """lm.StdlibTiny's config with the `tiny` fiddler, SMALL and `overrides` (PATH=VALUE)."""
  registry.import_all()
  cfg = registry.get('lm.StdlibTiny')().config()
  fiddlers.tiny(cfg)
  config_io.apply_overrides(cfg, [*SMALL, *overrides])
  if 'lora_rank' not in dict(cfg.mesh.rules):  # Until partitioning.DEFAULT_RULES has it.
    cfg.mesh.rules = (*cfg.mesh.rules, ('lora_rank', None))
  return cfg


def tiny_task(*overrides: str) -> Task:
  """The Task of `tiny_config(*overrides)`."""
  return config_io.build(tiny_config(*overrides))


def with_steps(placed: build.Trainer, num_steps: int) -> build.Trainer:
  """`placed` running to `num_steps` (the same compiled programs)."""
  task = dataclasses.replace(placed.task,
                             train=dataclasses.replace(placed.task.train, num_steps=num_steps))
  return dataclasses.replace(placed, task=task)


def restored(placed, job, step):
  """The train state committed at `step` in `job`."""
  checkpoints = Checkpoints(job / 'checkpoints', 5, read_only=True)
  try:
    return checkpoints.restore(placed.program.abstract_state, step=step)[1]
  finally:
    checkpoints.close()
