"""optax presets. Each returns a GradientTransformation whose numbers live in its state (through
`optax.inject_hyperparams`): the trainer logs the learning rate from there, and runs that differ
only in those numbers (a learning rate, a run length) share one compiled program."""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
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
          clip_norm: float | None = 1.0,
          moments_dtype: str = 'float32') -> optax.GradientTransformation:
  """AdamW with optional global-norm clipping. `moments_dtype` 'bfloat16' stores both moments
  in bfloat16 (half of Adam's state; the update is computed in float32, `scale_by_adam_in`);
  'float32' is optax's own adamw."""
  if jnp.dtype(moments_dtype) == jnp.float32:
    factory = optax.inject_hyperparams(optax.adamw)
  else:
    factory = optax.inject_hyperparams(
        functools.partial(_adamw_in, moments_dtype=jnp.dtype(moments_dtype)))
  return _clipped(_scheduled(lambda rate: factory(
      learning_rate=rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay), learning_rate),
      clip_norm)


def scale_by_adam_in(moments_dtype: Any, b1: float = 0.9, b2: float = 0.999,
                     eps: float = 1e-8) -> optax.GradientTransformation:
  """`optax.scale_by_adam` with both moments stored in `moments_dtype` (optax's `mu_dtype`
  covers only the first): each step reads them into float32, updates and bias-corrects them
  there, and stores them rounded back. The state is optax's `ScaleByAdamState`."""

  def init(params: Any) -> optax.ScaleByAdamState:
    zeros = lambda p: jnp.zeros(p.shape, moments_dtype)  # noqa: E731
    return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32),
                                  mu=jax.tree.map(zeros, params), nu=jax.tree.map(zeros, params))

  def update(updates: Any, state: optax.ScaleByAdamState, params: Any = None):
    del params
    count = optax.safe_increment(state.count)
    wide = lambda m: m.astype(jnp.float32)  # noqa: E731
    mu = jax.tree.map(lambda g, m: b1 * wide(m) + (1 - b1) * g, updates, state.mu)
    nu = jax.tree.map(lambda g, v: b2 * wide(v) + (1 - b2) * jnp.square(g), updates, state.nu)
    fix1, fix2 = 1 - b1 ** count.astype(jnp.float32), 1 - b2 ** count.astype(jnp.float32)
    out = jax.tree.map(lambda g, m, v: ((m / fix1) / (jnp.sqrt(v / fix2) + eps)).astype(g.dtype),
                       updates, mu, nu)
    narrow = lambda tree: jax.tree.map(lambda m: m.astype(moments_dtype), tree)  # noqa: E731
    return out, optax.ScaleByAdamState(count=count, mu=narrow(mu), nu=narrow(nu))

  return optax.GradientTransformation(init, update)


def _adamw_in(learning_rate: Any, b1: float, b2: float, eps: float, weight_decay: float,
              moments_dtype: Any) -> optax.GradientTransformation:
  """optax.adamw's chain with `scale_by_adam_in`'s moments."""
  return optax.chain(scale_by_adam_in(moments_dtype, b1, b2, eps),
                     optax.add_decayed_weights(weight_decay),
                     optax.scale_by_learning_rate(learning_rate))


def adafactor(learning_rate: ScalarOrSchedule = 1e-3, decay_rate: float = 0.8,
              clipping_threshold: float | None = 1.0, weight_decay: float | None = None,
              clip_norm: float | None = 1.0) -> optax.GradientTransformation:
  """`optax.adafactor`: second moments factored into a row and a column per matrix, no first
  moment, updates scaled by the parameter's RMS; optional global-norm clipping."""
  return _clipped(_scheduled(lambda rate: optax.inject_hyperparams(_adafactor)(
      learning_rate=rate, decay_rate=decay_rate, clipping_threshold=clipping_threshold,
      weight_decay_rate=weight_decay), learning_rate), clip_norm)


def _adafactor(learning_rate: Any, decay_rate: Any, clipping_threshold: Any,
               weight_decay_rate: Any) -> optax.GradientTransformation:
  """optax.adafactor with only its numbers as arguments (its shape-deciding ones, such as
  min_dim_size_to_factor, stay Python values under inject_hyperparams)."""
  return optax.adafactor(learning_rate=learning_rate, decay_rate=decay_rate,
                         clipping_threshold=clipping_threshold,
                         weight_decay_rate=weight_decay_rate)


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
