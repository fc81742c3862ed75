"""optax presets. Each returns a GradientTransformation whose numbers live in its state (through
`optax.inject_hyperparams`): the trainer logs the learning rate from there, and runs that differ
only in those numbers (a learning rate, a run length) share one compiled program."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax.numpy as jnp
import optax

ScalarOrSchedule = float | optax.Schedule


class WarmupCosine(NamedTuple):
  """`optax.warmup_cosine_decay_schedule` from 0 as numbers that may be traced: linear warmup
  to `peak_value` over `warmup_steps`, then cosine to `end_fraction * peak_value` at
  `decay_steps`, then flat. optax's schedule takes Python numbers and compiles them into the
  step; `adamw` and `sgd` keep these in the optimizer state instead. `cosine_fraction` is
  1 - `end_fraction`, both rounded from float64 as optax rounds them."""
  peak_value: Any
  warmup_steps: Any
  decay_steps: Any
  end_fraction: Any
  cosine_fraction: Any

  def __call__(self, count: Any) -> Any:
    # optax's arithmetic op for op (polynomial_schedule, cosine_decay_schedule, join_schedules):
    # on the same inputs, optax's rates to the bit (tests/trainer/test_optim.py). Where optax's
    # numbers are compiled in, XLA may fold them otherwise: a rate can move in its last bit.
    warmup = jnp.clip(count, 0, self.warmup_steps)
    rising = ((0.0 - self.peak_value) * (1 - warmup / jnp.maximum(self.warmup_steps, 1))
              + self.peak_value)
    cosine_steps = self.decay_steps - self.warmup_steps
    decaying = jnp.minimum(count - self.warmup_steps, cosine_steps)
    cosine = 0.5 * (1 + jnp.cos(jnp.pi * decaying / cosine_steps))
    falling = self.peak_value * (self.cosine_fraction * cosine + self.end_fraction)
    return jnp.where(count < self.warmup_steps, rising, falling)


def warmup_cosine(peak_value: float, decay_steps: int | None = None,
                  warmup_steps: int | None = None, end_fraction: float = 0.1) -> WarmupCosine:
  """Linear warmup from 0 to `peak_value`, then cosine to `end_fraction * peak_value` at
  `decay_steps` (then flat). `warmup_steps` None: a tenth of `decay_steps`, at most 50 (none
  for a 1-step run). A config that leaves `decay_steps` unset gets `train.num_steps`
  (`config_io.with_run_lengths`)."""
  if decay_steps is None:
    raise ValueError('warmup_cosine needs decay_steps (a task config fills it from '
                     'train.num_steps)')
  if warmup_steps is None:  # Shorter than the run, so a 1-step run trains at the peak.
    warmup_steps = min(50, max(1, decay_steps // 10), decay_steps - 1)
  if not 0 <= warmup_steps < decay_steps:
    raise ValueError(f'warmup_cosine needs 0 <= warmup_steps < decay_steps, got '
                     f'warmup_steps={warmup_steps}, decay_steps={decay_steps}')
  end = 0.0 if peak_value == 0 else peak_value * end_fraction / peak_value  # As optax's alpha.
  return WarmupCosine(float(peak_value), int(warmup_steps), int(decay_steps), end, 1 - end)


RUN_LENGTH_ARGS = {warmup_cosine: 'decay_steps'}  # Schedules whose length follows the run's.


def adamw(learning_rate: ScalarOrSchedule = 1e-3, b1: float = 0.9, b2: float = 0.95,
          eps: float = 1e-8, weight_decay: float = 0.1,
          clip_norm: float | None = 1.0) -> optax.GradientTransformation:
  """AdamW with optional global-norm clipping."""
  return _clipped(_scheduled(lambda rate: optax.inject_hyperparams(optax.adamw)(
      learning_rate=rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay), learning_rate),
      clip_norm)


def sgd(learning_rate: ScalarOrSchedule = 0.1, momentum: float | None = None,
        nesterov: bool = False, clip_norm: float | None = None) -> optax.GradientTransformation:
  """SGD, optionally with (Nesterov) momentum and clipping."""
  return _clipped(_scheduled(lambda rate: optax.inject_hyperparams(optax.sgd)(
      learning_rate=rate, momentum=momentum, nesterov=nesterov), learning_rate), clip_norm)


def _scheduled(make: Callable[[ScalarOrSchedule], optax.GradientTransformation],
               learning_rate: ScalarOrSchedule) -> optax.GradientTransformation:
  """`make(learning_rate)`; for a WarmupCosine, inside an `inject_hyperparams` that keeps the
  schedule's numbers in the state and hands them to `make` as arrays."""
  if not isinstance(learning_rate, WarmupCosine):
    return make(learning_rate)

  def on_schedule(peak_value, warmup_steps, decay_steps, end_fraction, cosine_fraction):
    return make(WarmupCosine(peak_value, warmup_steps, decay_steps, end_fraction, cosine_fraction))
  return optax.inject_hyperparams(on_schedule)(*learning_rate)


def _clipped(opt: optax.GradientTransformation, clip_norm: float | None):
  return opt if clip_norm is None else optax.chain(optax.clip_by_global_norm(clip_norm), opt)


def learning_rate_of(opt_state: Any) -> Any:
  """The current learning rate held in an `inject_hyperparams` state, or None."""
  return optax.tree_utils.tree_get(
      opt_state, 'learning_rate', default=None,
      filtering=lambda _, value: hasattr(value, 'dtype'))
