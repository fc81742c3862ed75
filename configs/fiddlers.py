"""Fiddlers: functions that edit a task config in place; apply with `--fdl_fiddler=NAME`."""

import fiddle as fdl

from configs import meshes


def tiny(cfg: fdl.Config) -> None:
  """A few-second smoke run: a small model and 20 steps."""
  cfg.train.num_steps = 20
  cfg.train.log_every = 5
  cfg.train.eval_every = 10
  cfg.train.checkpoint_every = 10
  if hasattr(cfg.model, 'num_layers'):
    cfg.model.num_layers = 1


def cpu8(cfg: fdl.Config) -> None:
  """A 4×2 data × model mesh, for 8 forced CPU devices."""
  cfg.mesh = meshes.data_model(2)
