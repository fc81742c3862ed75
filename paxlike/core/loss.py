"""The loss-function contract every algorithm trains with: `loss_fn(params, batch, rng) ->
(loss, metrics)`, rng None meaning no dropout.

A loss that is a mean over a batch's unmasked targets may say so by being a `MaskedMeanLoss`:
it keeps the sums its means divide, so that a data-parallel step can differentiate the sums and
divide afterwards (`value_and_mean_grad`): the same loss and gradient, with one all-reduce per
step instead of two (the target count's all-reduce need not stand between the forward and
backward passes).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

Batch = dict[str, jax.Array]
LossFn = Callable[[Any, Batch, jax.Array | None], tuple[jax.Array, dict[str, jax.Array]]]
# (params, batch, rng) -> (sum of the per-target losses, (target count, sums of the metrics)).
SumsFn = Callable[[Any, Batch, jax.Array | None],
                  tuple[jax.Array, tuple[jax.Array, dict[str, jax.Array]]]]


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean of `values` over positions where `mask` is 1 (0 when the mask is empty)."""
  return jnp.sum(values * mask) / _denominator(jnp.sum(mask))


def _denominator(count: jax.Array) -> jax.Array:
  return jnp.maximum(count, 1.0)


@dataclasses.dataclass(frozen=True)
class MaskedMeanLoss:
  """A `LossFn` whose loss and metrics are means over a batch's unmasked targets, kept as the
  `sums` they divide. Calling it gives the means, exactly as `masked_mean` would."""

  sums: SumsFn

  def __call__(self, params: Any, batch: Batch, rng: jax.Array | None
               ) -> tuple[jax.Array, dict[str, jax.Array]]:
    total, (count, metric_sums) = self.sums(params, batch, rng)
    return _means(total, count, metric_sums)


def _means(total: jax.Array, count: jax.Array, metric_sums: dict[str, jax.Array]
           ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(loss, metrics): the sums over the targets divided by their count (1 if none)."""
  denominator = _denominator(count)
  return total / denominator, {k: v / denominator for k, v in metric_sums.items()}


def value_and_mean_grad(loss_fn: LossFn, view: Callable[[Any], Any] = lambda p: p
                        ) -> Callable[[Any, Batch, jax.Array | None], tuple[Any, Any]]:
  """`jax.value_and_grad(lambda p, b, r: loss_fn(view(p), b, r), has_aux=True)`.

  For a MaskedMeanLoss it differentiates the sums and divides the gradient by the target count
  after the backward pass, so the count's all-reduce over a sharded batch can join the
  gradients' (the loss and metrics are the same expressions as the call's; the gradient
  differs only in rounding)."""
  if not isinstance(loss_fn, MaskedMeanLoss):
    return jax.value_and_grad(lambda p, batch, rng: loss_fn(view(p), batch, rng), has_aux=True)
  grad_sums = jax.value_and_grad(lambda p, batch, rng: loss_fn.sums(view(p), batch, rng),
                                 has_aux=True)

  def value_and_grad(params, batch, rng):
    (total, (count, metric_sums)), grads = grad_sums(params, batch, rng)
    denominator = _denominator(count)
    return (_means(total, count, metric_sums),
            jax.tree.map(lambda g: (g / denominator).astype(g.dtype), grads))
  return value_and_grad
