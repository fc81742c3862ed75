"""Centralized training as an algorithm: the same `(init, next)` pair the federated ones are.

`batches` has leading axes `[1, micro_batches, batch, ...]`: one "client" (the whole job; a
larger cohort is refused), and its local steps are micro-batches whose gradients are averaged
before one optimizer update (gradient accumulation with `lax.scan`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from paxlike import optim
from paxlike.algorithm import Algorithm, AlgorithmConfigError, cohort_size
from paxlike.losses import LossFn


class CentralizedState(NamedTuple):
  params: Any
  opt_state: optax.OptState


def centralized(loss_fn: LossFn, optimizer: optax.GradientTransformation) -> Algorithm:
  """Plain training: one optimizer update per step from the micro-batch-averaged gradient."""

  def init(params):
    return CentralizedState(params, optimizer.init(params))

  def next(state, batches, weights, rng):
    del weights  # One client: nothing to weight.
    clients = cohort_size(batches)
    if clients != 1:
      raise AlgorithmConfigError(f'centralized training takes a cohort of 1 client, got '
                                 f'{clients}; set data.clients_per_round=1.')
    micro = jax.tree.map(lambda x: x[0], batches)
    num_micro = jax.tree.leaves(micro)[0].shape[0]

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def accumulate(total, inputs):
      batch, key = inputs
      return jax.tree.map(jnp.add, total, grad_fn(state.params, batch, key)), None

    first = jax.tree.map(lambda x: x[0], micro)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                         jax.eval_shape(grad_fn, state.params, first, rng))
    total, _ = jax.lax.scan(accumulate, zeros, (micro, jax.random.split(rng, num_micro)))
    (loss, aux), grads = jax.tree.map(lambda x: x / num_micro, total)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    new = CentralizedState(optax.apply_updates(state.params, updates), opt_state)
    metrics = {'loss': loss, 'grad_norm': optax.tree.norm(grads), **aux,
               'learning_rate': optim.learning_rate_of(opt_state)}
    return new, metrics

  return Algorithm(init, next)
