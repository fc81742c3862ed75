"""optax presets. Each returns a GradientTransformation whose learning rate is readable from its
state (through `optax.inject_hyperparams`), so the trainer can log it. Schedules are optax's."""

from __future__ import annotations

from typing import Any

import optax

ScalarOrSchedule = float | optax.Schedule


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
