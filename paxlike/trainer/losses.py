"""The one loss every task uses: masked softmax cross-entropy of logits against integer targets.

LM batches have targets [B, T] and logits [B, T, V]; classifiers have targets [B] and logits
[B, C]. A `mask` of zeros removes padding and missing examples from both the loss and its weight.
Packed LM batches also carry `segment_ids` and `positions` [B, T], which go to the model.
A mixture-of-experts model's layers sow their auxiliary losses (paxlike.layers.moe); the
training loss adds them, and its metrics report them (`MOE_METRICS`).

A dense model's loss is a `MaskedMeanLoss`: it keeps the sums over the targets that its means
divide, so that a data-parallel step can differentiate the sums and divide afterwards
(`value_and_mean_grad`): the same loss and gradient, with one all-reduce per step instead of
two (the target count's all-reduce no longer stands between the forward and backward passes).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from paxlike.layers import moe

Batch = dict[str, jax.Array]
LossFn = Callable[[Any, Batch, jax.Array | None], tuple[jax.Array, dict[str, jax.Array]]]
# (params, batch, rng) -> (sum of the per-target losses, (target count, sums of the metrics)).
SumsFn = Callable[[Any, Batch, jax.Array | None],
                  tuple[jax.Array, tuple[jax.Array, dict[str, jax.Array]]]]


def per_example_loss(logits: jax.Array, batch: Batch) -> tuple[jax.Array, jax.Array]:
  """Float32 cross-entropy and correctness per target position, before masking."""
  logits = logits.astype(jnp.float32)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch['targets'])
  correct = (jnp.argmax(logits, axis=-1) == batch['targets']).astype(jnp.float32)
  return losses, correct


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


PACKING_KEYS = ('segment_ids', 'positions')


def model_inputs(batch: Batch) -> dict[str, jax.Array]:
  """The keyword inputs of the model besides the tokens: a packed batch's segment ids and
  positions, where the batch has them."""
  return {key: batch[key] for key in PACKING_KEYS if key in batch}


# Row keys of a MoE model's statistics (`moe.summarize`'s names): the weighted auxiliary loss
# the training loss includes, its two unweighted terms, the share of routing choices dropped
# over capacity, and the busiest expert's share of the choices (max over layers).
MOE_METRICS = {'loss': 'moe_aux_loss', 'aux_loss': 'moe_balance_loss', 'z_loss': 'moe_z_loss',
               'dropped': 'moe_dropped_fraction', 'max_load': 'moe_max_expert_load'}


def _logits(model: nn.Module, params: Any, batch: Batch, rng: jax.Array | None) -> jax.Array:
  rngs = {} if rng is None else {'dropout': rng}
  return model.apply({'params': params}, batch['inputs'], deterministic=rng is None, rngs=rngs,
                     **model_inputs(batch))


def model_loss_fn(model: nn.Module) -> LossFn:
  """`loss_fn(params, batch, rng) -> (loss, aux)` for `model`; rng=None means no dropout. A
  dense model's is a MaskedMeanLoss; a MoE model's loss is the cross-entropy plus its layers'
  weighted auxiliary losses (not a mean over targets)."""
  if not moe.is_moe(model):
    def sums(params, batch, rng):
      losses, correct = per_example_loss(_logits(model, params, batch, rng), batch)
      mask = batch['mask'].astype(jnp.float32)
      return jnp.sum(losses * mask), (jnp.sum(mask), {'accuracy': jnp.sum(correct * mask)})
    return MaskedMeanLoss(sums)
  return _moe_loss_fn(model)


def _moe_loss_fn(model: nn.Module) -> LossFn:
  """The cross-entropy plus the weighted auxiliary losses the MoE layers sow; their statistics
  join the metrics."""

  def loss_fn(params, batch, rng):
    rngs = {} if rng is None else {'dropout': rng}
    logits, sown = model.apply({'params': params}, batch['inputs'], deterministic=rng is None,
                               rngs=rngs, mutable=[moe.COLLECTION], **model_inputs(batch))
    losses, correct = per_example_loss(logits, batch)
    mask = batch['mask'].astype(jnp.float32)
    stats = moe.summarize(sown.get(moe.COLLECTION, {}))
    metrics = {'accuracy': masked_mean(correct, mask),
               **{MOE_METRICS[name]: value for name, value in stats.items()}}
    return masked_mean(losses, mask) + stats['loss'], metrics
  return loss_fn
