"""The one loss every task uses: masked softmax cross-entropy of logits against integer targets.

LM batches have targets [B, T] and logits [B, T, V]; classifiers have targets [B] and logits
[B, C]. A `mask` of zeros removes padding and missing examples from both the loss and its weight.
Packed LM batches also carry `segment_ids` and `positions` [B, T], which go to the model.
A mixture-of-experts model's layers sow their auxiliary losses (paxlike.layers.moe); the
training loss adds them, and its metrics report them (`MOE_METRICS`).
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from paxlike.layers import moe

Batch = dict[str, jax.Array]
LossFn = Callable[[Any, Batch, jax.Array | None], tuple[jax.Array, dict[str, jax.Array]]]


def per_example_loss(logits: jax.Array, batch: Batch) -> tuple[jax.Array, jax.Array]:
  """Float32 cross-entropy and correctness per target position, before masking."""
  logits = logits.astype(jnp.float32)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch['targets'])
  correct = (jnp.argmax(logits, axis=-1) == batch['targets']).astype(jnp.float32)
  return losses, correct


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean of `values` over positions where `mask` is 1 (0 when the mask is empty)."""
  return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


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


def model_loss_fn(model: nn.Module) -> LossFn:
  """`loss_fn(params, batch, rng) -> (loss, aux)` for `model`; rng=None means no dropout. A
  MoE model's loss is the cross-entropy plus its layers' weighted auxiliary losses."""
  sparse = moe.is_moe(model)

  def loss_fn(params, batch, rng):
    rngs = {} if rng is None else {'dropout': rng}
    out = model.apply({'params': params}, batch['inputs'], deterministic=rng is None, rngs=rngs,
                      mutable=[moe.COLLECTION] if sparse else False, **model_inputs(batch))
    logits, sown = out if sparse else (out, {})
    losses, correct = per_example_loss(logits, batch)
    mask = batch['mask'].astype(jnp.float32)
    loss, metrics = masked_mean(losses, mask), {'accuracy': masked_mean(correct, mask)}
    if sparse:
      stats = moe.summarize(sown.get(moe.COLLECTION, {}))
      loss = loss + stats['loss']
      metrics.update({MOE_METRICS[name]: value for name, value in stats.items()})
    return loss, metrics
  return loss_fn
