"""The one loss every task uses: masked softmax cross-entropy of logits against integer targets.

LM batches have targets [B, T] and logits [B, T, V]; classifiers have targets [B] and logits
[B, C]. A `mask` of zeros removes padding and missing examples from both the loss and its weight.
Packed LM batches also carry `segment_ids` and `positions` [B, T], which go to the model.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

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


def model_loss_fn(model: nn.Module) -> LossFn:
  """`loss_fn(params, batch, rng) -> (loss, aux)` for `model`; rng=None means no dropout."""
  def loss_fn(params, batch, rng):
    rngs = {} if rng is None else {'dropout': rng}
    logits = model.apply({'params': params}, batch['inputs'], deterministic=rng is None, rngs=rngs,
                         **model_inputs(batch))
    losses, correct = per_example_loss(logits, batch)
    mask = batch['mask'].astype(jnp.float32)
    return masked_mean(losses, mask), {'accuracy': masked_mean(correct, mask)}
  return loss_fn
