"""Fiddlers: functions that edit a task config in place; apply with `--fdl_fiddler=NAME`."""

import fiddle as fdl
import jax.numpy as jnp

from paxlike.configs import meshes, optimizers, sizes
from paxlike.core import optim
from paxlike.errors import UserError
from paxlike.families import family_of
from paxlike.core.partitioning import MeshConfig


def tiny(cfg: fdl.Config) -> None:
  """A few-second smoke run: a small model and 20 steps."""
  cfg.train.num_steps = 20
  cfg.train.log_every = 5
  cfg.train.eval_every = 10
  cfg.train.checkpoint_every = 10
  family_of(cfg.model).shrink(cfg.model)


def cpu8(cfg: fdl.Config) -> None:
  """A 4×2 data × model mesh, for 8 forced CPU devices."""
  cfg.mesh = meshes.data_model(2)


def cpu8_expert(cfg: fdl.Config) -> None:
  """4 expert × 2 data, for 8 forced CPU devices: a MoE model's experts split 4 ways (its
  num_experts must be a multiple of 4); every other layer is data parallel over all 8."""
  cfg.mesh = fdl.Config(MeshConfig, ici=(2, 4), axes=('data', 'expert'))


def cpu8_stage(cfg: fdl.Config) -> None:
  """4 stage × 2 data, for 8 forced CPU devices: the LM's scanned layers as a 4-stage GPipe
  pipeline of 2 microbatches (num_layers rounded up to a multiple of 4)."""
  cfg.mesh = meshes.stage_data(4)
  cfg.model.scan_layers = True
  cfg.model.num_layers = 4 * max(1, -(-cfg.model.num_layers // 4))
  cfg.train.microbatches = 2


def size_125m(cfg: fdl.Config) -> None:
  """The 125M Llama-shaped LM and its recommended mesh."""
  sizes.use_size(cfg, '125m')


def size_350m(cfg: fdl.Config) -> None:
  sizes.use_size(cfg, '350m')


def size_1b(cfg: fdl.Config) -> None:
  sizes.use_size(cfg, '1b')


def size_8b(cfg: fdl.Config) -> None:
  sizes.use_size(cfg, '8b')


def size_8b_pipeline(cfg: fdl.Config) -> None:
  """The 8B on a pod as 4 pipeline stages across hosts × FSDP × tensor parallel 4 inside each
  (16 microbatches), e.g. on lm.Llama8B's data."""
  sizes.use_size(cfg, '8b_pipeline')


def size_moe_1b(cfg: fdl.Config) -> None:
  """The 1.1B mixture of experts (0.45B active) for one GPU, e.g. on lm.Llama1B's data."""
  sizes.use_size(cfg, 'moe_1b')


def bf16_moments(cfg: fdl.Config) -> None:
  """AdamW's two moments stored in bfloat16 (computed in float32): 8 bytes of state per
  parameter instead of 12 with the float32 params (the 1B on one 16 GB chip)."""
  if getattr(cfg.optimizer, '__fn_or_cls__', None) is not optim.adamw:
    raise UserError('the bf16_moments fiddler needs an AdamW optimizer (optim.adamw)')
  cfg.optimizer.moments_dtype = 'bfloat16'


def adafactor(cfg: fdl.Config) -> None:
  """Adafactor instead of AdamW, on the same learning-rate schedule: factored second moments
  and no first moment, so the optimizer state is a few bytes per matrix row and column."""
  schedule = getattr(cfg.optimizer, 'learning_rate', None)
  new = optimizers.adafactor()
  if schedule is not None:
    new.learning_rate = schedule
  cfg.optimizer = new


def one_chip_16gb(cfg: fdl.Config) -> None:
  """The per-chip batch and memory options that fit a Llama preset's size on one 16 GB chip (a
  TPU v5e), one device: paxlike/configs/sizes.py CHIP_16GB. The 350M and the 1B keep their params
  in bfloat16 (no float32 copy: fine for a fine-tune, lossy for a long pre-training run; the
  350M with float32 params fits at batch 4, 54.3% MFU on a v5e where bf16 gave 57.5%)."""
  name = sizes.size_of(cfg.model)
  if name not in sizes.CHIP_16GB:
    fits = ', '.join(sorted(sizes.CHIP_16GB))
    raise UserError(f'one_chip_16gb: no measured fit for this model (size {name}); sizes {fits}'
                    + ('; the 8b needs a quantized base (LoRA) or a pod' if name == '8b' else ''))
  fit = sizes.CHIP_16GB[name]
  cfg.data.batch_size = fit.batch
  if hasattr(cfg.data, 'eval_batch_size'):
    cfg.data.eval_batch_size = fit.batch
  cfg.model.remat_policy = fit.remat_policy
  if fit.bf16_params:
    cfg.model.param_dtype = jnp.bfloat16
  cfg.mesh = meshes.data_parallel()
