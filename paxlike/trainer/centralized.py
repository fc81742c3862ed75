"""Centralized training as an algorithm: the same `(init, next)` pair the federated ones are.

`batches` has leading axes `[1, micro_batches, batch, ...]`: one "client" (the whole job; a
larger cohort is refused), and its local steps are micro-batches whose gradients are averaged
before one optimizer update (gradient accumulation with `lax.scan`).

With `trainable` (a function of the params giving a tree of bools, e.g. LoRA's `lora_mask`),
only the marked leaves are trained: the gradient is taken w.r.t. them alone (XLA computes no
gradient of the frozen ones) and the optimizer state is kept for them alone.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from paxlike.core import optim
from paxlike.core.algorithm import Algorithm, AlgorithmConfigError, cohort_size
from paxlike.core.loss import LossFn, value_and_mean_grad
from paxlike.core.trainable import TrainableMask, merge_params, split_params


class CentralizedState(NamedTuple):
  params: Any
  opt_state: optax.OptState  # Of the trainable params only (all of them without a mask).


def centralized(loss_fn: LossFn, optimizer: optax.GradientTransformation,
                trainable: TrainableMask | None = None) -> Algorithm:
  """Plain training: one optimizer update per step from the micro-batch-averaged gradient
  (of the `trainable` leaves only, when given)."""

  def init(params):
    return CentralizedState(params, optimizer.init(split_params(params, trainable)[0]))

  def next(state, batches, weights, rng):
    del weights  # One client: nothing to weight.
    clients = cohort_size(batches)
    if clients != 1:
      raise AlgorithmConfigError(f'centralized training takes a cohort of 1 client, got '
                                 f'{clients}; set data.clients_per_round=1.')
    micro = jax.tree.map(lambda x: x[0], batches)
    num_micro = jax.tree.leaves(micro)[0].shape[0]

    params, frozen = split_params(state.params, trainable)
    # A masked-mean loss is differentiated as sums and divided after: one all-reduce per step.
    grad_fn = value_and_mean_grad(loss_fn, lambda p: merge_params(p, frozen))

    # The sum starts from zeros shaped by eval_shape, whose trace the scan's jit call reuses
    # (same function, same argument types): the loss is traced once.
    keys = jax.random.split(rng, num_micro)
    first = jax.tree.map(lambda x: x[0], (micro, keys))
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                         jax.eval_shape(grad_fn, params, *first))
    traced_grad_fn = jax.jit(grad_fn)

    def accumulate(total, inputs):
      return jax.tree.map(jnp.add, total, traced_grad_fn(params, *inputs)), None

    total, _ = jax.lax.scan(accumulate, zeros, (micro, keys))
    (loss, aux), grads = jax.tree.map(lambda x: x / num_micro, total)
    updates, opt_state = optimizer.update(grads, state.opt_state, params)
    new = CentralizedState(merge_params(optax.apply_updates(params, updates), frozen), opt_state)
    metrics = {'loss': loss, 'grad_norm': optax.tree.norm(grads), **aux,
               'learning_rate': optim.learning_rate_of(opt_state)}
    return new, metrics

  over_trainable = None if trainable is not None else (
      lambda mask: centralized(loss_fn, optimizer, trainable=mask))
  return Algorithm(init, next, over_trainable=over_trainable)
