"""The client side of a round, which every algorithm shares: one client's local steps
(`client_update`, with FedProx's proximal term and stragglers' skipped steps), the cohort's
fresh optimizer states (`placed_init`), the round's metrics from the clients' stats, and k
local steps of every client from one model (`fine_tuned`: personalization)."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from paxlike.core import optim
from paxlike.core.loss import LossFn
from paxlike.federated import stragglers
from paxlike.federated.primitives import (federated_broadcast, federated_map, federated_mean,
                                          federated_program, federated_weighted_mean)

ClientUpdate = Callable[[Any, Any, Any, jax.Array], tuple[Any, Any, dict[str, jax.Array]]]


def client_update(loss_fn: LossFn, optimizer: optax.GradientTransformation,
                  prox_mu: float = 0.0) -> ClientUpdate:
  """`update(params, opt_state, batches, rng) -> (params, opt_state, stats)` for one client.

  `prox_mu` > 0 is FedProx (Li et al. 2020): the client minimises loss + μ/2‖w − w₀‖², w₀ the
  params it started from (the global model), so μ(w − w₀) is added to every gradient.

  Runs one optimizer step per entry of the local-steps axis of `batches`; where the batches
  carry a STEP_MASK (stragglers, padded slots: stragglers.py), a step the client does not run
  leaves its params and optimizer state as they were. `stats` holds scalars: `loss` (mean over
  the local steps run), `loss_before` (the first step's loss, at the starting params),
  `loss_after` (the final params on the last local batch run, with that step's rng) and the
  loss_fn's aux values averaged over the local steps run.
  """
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def update(params, opt_state, batches, rng):
    batches, active = stragglers.split_steps(batches)
    keys = jax.random.split(rng, jax.tree.leaves(batches)[0].shape[0])
    anchor = params

    def step(carry, inputs):
      params, opt_state = carry
      batch, key = inputs[:2]
      (loss, aux), grads = grad_fn(params, batch, key)
      if prox_mu:
        grads = jax.tree.map(lambda g, w, w0: g + prox_mu * (w - w0), grads, params, anchor)
      updates, opt_state = optimizer.update(grads, opt_state, params)
      new = (optax.apply_updates(params, updates), opt_state)
      if active is not None:  # A step the client does not run is no step.
        new = stragglers.keep_if(~inputs[2], carry, new)
      return new, (loss, aux)

    steps = (batches, keys) if active is None else (batches, keys, active)
    (params, opt_state), (losses, aux) = jax.lax.scan(step, (params, opt_state), steps)
    if active is None:
      loss_after, _ = loss_fn(params, jax.tree.map(lambda x: x[-1], batches), keys[-1])
      stats = {**jax.tree.map(lambda v: jnp.mean(v, axis=0), aux),
               'loss': jnp.mean(losses), 'loss_before': losses[0]}
    else:
      loss_after, _ = loss_fn(params, *stragglers.last_run(batches, keys, active))
      stats = stragglers.run_stats(losses, aux, active)
    return params, opt_state, {**stats, 'loss_after': loss_after}

  return update


def round_metrics(stats: dict[str, jax.Array], pseudo_grad: Any, learning_rate: jax.Array | None,
                  clients: int) -> dict[str, jax.Array]:
  """A round's metrics: the (server-placed) client `stats`, plus `clients`, `pseudo_grad_norm`
  and the client `learning_rate` where it is readable (not None)."""
  metrics = {**stats, 'clients': jnp.asarray(clients, jnp.int32),
             'pseudo_grad_norm': optax.tree.norm(pseudo_grad)}
  if learning_rate is not None:
    metrics['learning_rate'] = learning_rate
  return metrics


def cohort_metrics(stats: dict[str, jax.Array], weights: jax.Array, pseudo_grad: Any,
                   client_learning_rate: jax.Array | None, clients: int | jax.Array,
                   present: jax.Array | None = None) -> dict[str, jax.Array]:
  """`round_metrics` of client-placed stats (their weighted mean; with `present`, over the real
  clients only, see stragglers.real_client_mean) and the clients' learning rates (every client
  runs the same schedule: their mean; None where the optimizer's is not readable). Call inside
  the federated program."""
  mean = (federated_weighted_mean(stats, weights) if present is None
          else stragglers.real_client_mean(stats, weights, present))
  return round_metrics(mean, pseudo_grad, None if client_learning_rate is None
                       else federated_mean(client_learning_rate), clients)


def fresh_client_update(update: ClientUpdate, optimizer: optax.GradientTransformation
                        ) -> Callable[[Any, Any, jax.Array], tuple[Any, Any, dict]]:
  """`update` from a fresh `optimizer` state made on the client: `(params, batches, rng) ->
  (params, learning rate or None, stats)`. The rest of the state ends where it is made, so a
  round that maps its clients a chunk at a time never holds N optimizer states."""

  def fresh(params, batches, rng):
    params, opt_state, stats = update(params, optimizer.init(params), batches, rng)
    return params, optim.learning_rate_of(opt_state), stats

  return fresh


def placed_init(optimizer: optax.GradientTransformation, clients: int) -> Callable[[Any], tuple]:
  """`init(params) -> (client_params, client_opt_state)`: params broadcast to `clients` slots,
  each with a fresh optimizer state (leading axis `clients` on every leaf)."""

  @federated_program(clients=clients)
  def init(params):
    client_params = federated_broadcast(params)
    return client_params, federated_map(optimizer.init, client_params)

  return init


def fine_tuned(loss_fn: LossFn, optimizer: optax.GradientTransformation
               ) -> Callable[[Any, Any, jax.Array], Any]:
  """`tune(params, batches [clients, k, ...], rng)` -> client-placed params: every client's k
  local steps (`client_update`, a fresh `optimizer` state) from the same `params`, as one
  federated program. What personalization evaluates (trainer/evaluation.py)."""
  update = client_update(loss_fn, optimizer)

  def tune(params: Any, batches: Any, rng: jax.Array) -> Any:
    clients = jax.tree.leaves(batches)[0].shape[0]

    @federated_program(clients=clients)
    def run(params, batches, rng):
      start = federated_broadcast(params)
      tuned, _, _ = federated_map(update, (start, federated_map(optimizer.init, start), batches,
                                           jax.random.split(rng, clients)))
      return tuned

    return run(params, batches, rng)

  return tune
