"""SCAFFOLD (Karimireddy et al. 2020): FedAvg with control variates that correct client drift.

Every client i keeps a control variate cᵢ (an estimate of its own gradient) and the server keeps
c = mean(cᵢ). Each local step follows the corrected gradient g − cᵢ + c, so a client whose data
pulls away from the others is steered back towards the global objective, and many local steps
no longer move the fixed point away from the optimum (as they do in FedAvg). After the round,
cᵢ⁺ is the mean of the client's raw gradients over its local steps (the paper's option II,
(x − yᵢ)/(Kη) − c + cᵢ, written without the step size, so any client optimizer works; for SGD
it is the same number), and c moves by the mean of the cᵢ⁺ − cᵢ.

Cohorts: the cᵢ are client-placed state (leading axis = num_clients), so SCAFFOLD supports only
the full population every round in a fixed order (data sampling 'fixed', slot i = client i);
sampled cohorts are refused. Clients count equally (the paper's uniform average), whatever
their weights.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from paxlike.core.algorithm import Algorithm, AlgorithmConfigError, FixedCohort, cast_like, cohort_size
from paxlike.federated.clients import cohort_metrics
from paxlike.federated.chunking import resolve_client_chunk
from paxlike.federated.options import refuse_options
from paxlike.federated.primitives import (federated_broadcast, federated_map, federated_mean,
                                          federated_program)
from paxlike.core.loss import LossFn


class ScaffoldState(NamedTuple):
  """Server params and optimizer state, the server control variate c (params-shaped) and the
  clients' cᵢ (leading axis num_clients)."""

  params: Any
  server_opt_state: optax.OptState
  control: Any
  client_controls: Any


def corrected_update(loss_fn: LossFn, optimizer: optax.GradientTransformation):
  """`update(params, control, client_control, batches, rng) -> (params, new client control,
  stats)`: one client's local steps along g − cᵢ + c, from a fresh optimizer state."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def update(params, control, client_control, batches, rng):
    steps = jax.tree.leaves(batches)[0].shape[0]
    keys = jax.random.split(rng, steps)
    correction = jax.tree.map(jnp.subtract, control, client_control)

    def step(carry, inputs):
      params, opt_state, grad_sum = carry
      batch, key = inputs
      (loss, aux), grads = grad_fn(params, batch, key)
      corrected = jax.tree.map(jnp.add, grads, correction)
      updates, opt_state = optimizer.update(corrected, opt_state, params)
      grad_sum = jax.tree.map(jnp.add, grad_sum, grads)
      return (optax.apply_updates(params, updates), opt_state, grad_sum), (loss, aux)

    zeros = jax.tree.map(jnp.zeros_like, params)
    (params, _, grad_sum), (losses, aux) = jax.lax.scan(
        step, (params, optimizer.init(params), zeros), (batches, keys))
    stats = {**jax.tree.map(lambda v: jnp.mean(v, axis=0), aux),
             'loss': jnp.mean(losses), 'loss_before': losses[0]}
    return params, jax.tree.map(lambda s: s / steps, grad_sum), stats

  return update


def scaffold(loss_fn: LossFn, optimizer: optax.GradientTransformation, num_clients: int,
             server_optimizer: optax.GradientTransformation = optax.sgd(1.0),
             client_chunk: int | None = None, aggregator: None = None,
             prox_mu: float = 0.0) -> Algorithm:
  """SCAFFOLD over a fixed population of `num_clients` (every client every round); the server
  optimizer steps along params − mean(client params) (SGD at lr 1: the paper's η_g = 1). The
  round options (federated/options.py): `client_chunk`, clients trained at a time; no
  `aggregator` and no `prox_mu` (the control variates are what corrects the drift)."""
  if num_clients < 1:
    raise AlgorithmConfigError(f'scaffold needs num_clients >= 1, got {num_clients}.')
  refuse_options('scaffold', 'the control variates correct the drift', aggregator, prox_mu)
  update = corrected_update(loss_fn, optimizer)

  def init(params):
    control = jax.tree.map(jnp.zeros_like, params)
    client_controls = federated_program(clients=num_clients)(federated_broadcast)(control)
    return ScaffoldState(params, server_optimizer.init(params), control, client_controls)

  def next(state, batches, weights, rng):
    clients = cohort_size(batches, (num_clients, 'clients (scaffold)'))

    @federated_program(clients=clients)
    def round_(state, batches, weights, rng):
      keys = jax.random.split(rng, clients)
      client_params, client_controls, stats = federated_map(update, (
          federated_broadcast(state.params), federated_broadcast(state.control),
          state.client_controls, batches, keys), chunk=resolve_client_chunk(client_chunk))
      pseudo_grad = cast_like(jax.tree.map(
          jnp.subtract, state.params, federated_mean(client_params)), state.params)
      updates, server_opt_state = server_optimizer.update(
          pseudo_grad, state.server_opt_state, state.params)
      control_step = federated_mean(jax.tree.map(
          jnp.subtract, client_controls, state.client_controls))
      control = jax.tree.map(jnp.add, state.control, control_step)
      metrics = cohort_metrics(stats, weights, pseudo_grad, None, clients)
      metrics['control_norm'] = optax.tree.norm(control)
      return ScaffoldState(optax.apply_updates(state.params, updates), server_opt_state,
                           control, client_controls), metrics

    return round_(state, batches, weights, rng)

  fixed = FixedCohort(num_clients, 'num_clients', True, lambda n: scaffold(
      loss_fn, optimizer, n, server_optimizer, client_chunk, aggregator, prox_mu))
  return Algorithm(init, next, fixed_cohort=fixed)
