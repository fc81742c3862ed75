"""The one loss every task uses: masked softmax cross-entropy of logits against integer targets.

LM batches have targets [B, T] and logits [B, T, V]; classifiers have targets [B] and logits
[B, C]. A `mask` of zeros removes padding and missing examples from both the loss and its weight.
Packed LM batches also carry `segment_ids` and `positions` [B, T], which go to the model.
A mixture-of-experts model's layers sow their auxiliary losses (paxlike.layers.moe); the
training loss adds them, and its metrics report them (`MOE_METRICS`).

A dense model's loss is a `MaskedMeanLoss` (paxlike/core/loss.py): its means are kept as the
sums they divide, so a data-parallel step differentiates the sums and divides afterwards.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from paxlike.core.loss import Batch, LossFn, MaskedMeanLoss, masked_mean
from paxlike.layers import moe


def per_example_loss(logits: jax.Array, batch: Batch) -> tuple[jax.Array, jax.Array]:
  """Float32 cross-entropy and correctness per target position, before masking."""
  logits = logits.astype(jnp.float32)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch['targets'])
  correct = (jnp.argmax(logits, axis=-1) == batch['targets']).astype(jnp.float32)
  return losses, correct


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
