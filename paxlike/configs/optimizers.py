"""Optimizer presets as Fiddle configs (optax underneath, see paxlike/core/optim.py)."""

import fiddle as fdl
import optax

from paxlike.core import optim


def warmup_cosine(peak: float, total_steps: int | None = None,
                  warmup_steps: int | None = None) -> fdl.Config:
  """Linear warmup (default: a tenth of the run, at most 50 steps), then cosine to peak/10 at
  `total_steps`; None (the presets' choice) makes it follow `train.num_steps`, overrides too."""
  cfg = fdl.Config(optim.warmup_cosine, peak_value=peak)
  if total_steps is not None:
    cfg.decay_steps = total_steps
  if warmup_steps is not None:
    cfg.warmup_steps = warmup_steps
  return cfg


def adamw(peak: float = 3e-3, total_steps: int | None = None, warmup_steps: int | None = None,
          weight_decay: float = 0.1) -> fdl.Config:
  """AdamW on a warmup-cosine schedule (see `warmup_cosine`), clipped at global norm 1. Its
  moments in bfloat16: `--fdl_set=optimizer.moments_dtype=bfloat16` (or the `bf16_moments`
  fiddler)."""
  return fdl.Config(optim.adamw, learning_rate=warmup_cosine(peak, total_steps, warmup_steps),
                    weight_decay=weight_decay)


def adafactor(peak: float = 3e-3, total_steps: int | None = None,
              warmup_steps: int | None = None) -> fdl.Config:
  """Adafactor (optax's: factored second moments, no first moment) on a warmup-cosine
  schedule, clipped at global norm 1: the smallest optimizer state (the `adafactor` fiddler)."""
  return fdl.Config(optim.adafactor, learning_rate=warmup_cosine(peak, total_steps, warmup_steps))


def sgd(learning_rate: float = 0.1, momentum: float | None = None) -> fdl.Config:
  return fdl.Config(optim.sgd, learning_rate=learning_rate, momentum=momentum)


def constant_adamw(learning_rate: float = 3e-3, weight_decay: float = 0.0) -> fdl.Config:
  """AdamW at a constant rate (clipped at norm 1): FedAvg/FedOpt clients get a fresh optimizer
  state every round, so a schedule would restart each round."""
  return fdl.Config(optim.adamw, learning_rate=learning_rate, weight_decay=weight_decay)
