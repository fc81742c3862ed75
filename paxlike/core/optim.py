"""optax presets. Each returns a GradientTransformation whose learning rate is readable from its
state (through `optax.inject_hyperparams`), so the trainer can log it. Schedules are optax's."""

from __future__ import annotations

from typing import Any

import optax

ScalarOrSchedule = float | optax.Schedule


def warmup_cosine(peak_value: float, decay_steps: int | None = None,
                  warmup_steps: int | None = None, end_fraction: float = 0.1) -> optax.Schedule:
  """Linear warmup from 0 to `peak_value`, then cosine to `end_fraction * peak_value` at
  `decay_steps` (then flat). `warmup_steps` None: a tenth of `decay_steps`, at most 50 (none
  for a 1-step run). A config that leaves `decay_steps` unset gets `train.num_steps`
  (`config_io.with_run_lengths`)."""
  if decay_steps is None:
    raise ValueError('warmup_cosine needs decay_steps (a task config fills it from '
                     'train.num_steps)')
  if warmup_steps is None:  # Shorter than the run, so a 1-step run trains at the peak.
    warmup_steps = min(50, max(1, decay_steps // 10), decay_steps - 1)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=peak_value, warmup_steps=warmup_steps,
      decay_steps=decay_steps, end_value=peak_value * end_fraction)


RUN_LENGTH_ARGS = {warmup_cosine: 'decay_steps'}  # Schedules whose length follows the run's.


def adamw(learning_rate: ScalarOrSchedule = 1e-3, b1: float = 0.9, b2: float = 0.95,
          eps: float = 1e-8, weight_decay: float = 0.1,
          clip_norm: float | None = 1.0) -> optax.GradientTransformation:
  """AdamW with optional global-norm clipping."""
  opt = optax.inject_hyperparams(optax.adamw)(
      learning_rate=learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
  return _clipped(opt, clip_norm)


def sgd(learning_rate: ScalarOrSchedule = 0.1, momentum: float | None = None,
        nesterov: bool = False, clip_norm: float | None = None) -> optax.GradientTransformation:
  """SGD, optionally with (Nesterov) momentum and clipping."""
  opt = optax.inject_hyperparams(optax.sgd)(
      learning_rate=learning_rate, momentum=momentum, nesterov=nesterov)
  return _clipped(opt, clip_norm)


def _clipped(opt: optax.GradientTransformation, clip_norm: float | None):
  return opt if clip_norm is None else optax.chain(optax.clip_by_global_norm(clip_norm), opt)


def learning_rate_of(opt_state: Any) -> Any:
  """The current learning rate held in an `inject_hyperparams` state, or None."""
  return optax.tree_utils.tree_get(
      opt_state, 'learning_rate', default=None,
      filtering=lambda _, value: hasattr(value, 'dtype'))
