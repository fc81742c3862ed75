"""Branch-Train-Merge (Li et al. 2022): experts branch from a seed model and train on one domain
each; the result is their (weighted) parameter average, or an ensemble weighted by the domain
posterior.

Expert k trains only on cohort slot k (the data side feeds domain k's batches there every
round), with its own optimizer state; experts and states are client-placed (leading axis =
experts). `state.params` is the merged model: the weighted parameter average of the experts with
`merge_weights`, or by default with the examples each domain has seen so far.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from paxlike.centralized import Algorithm
from paxlike.federated.algorithms import (AlgorithmConfigError, client_update, cohort_size,
                                          placed_init, round_metrics)
from paxlike.federated.primitives import (federated_broadcast, federated_map, federated_program,
                                          federated_weighted_mean)
from paxlike.losses import LossFn


class BtmState(NamedTuple):
  """`params`: the merged experts; `experts`/`opt_state`: per expert, leading axis = experts;
  `domain_examples`: float32 [experts], the example weights each expert has trained on."""

  params: Any
  experts: Any
  opt_state: Any
  domain_examples: jax.Array


def btm(loss_fn: LossFn, optimizer: optax.GradientTransformation, num_experts: int,
        merge_weights: Sequence[float] | None = None) -> Algorithm:
  """BTM with `num_experts` experts branched from the params passed to `init` (the seed). Needs
  cohort size = num_experts, slot k → domain k. Each round trains every expert for the batches'
  local steps, then merges."""
  if num_experts < 1:
    raise AlgorithmConfigError(f'num_experts must be >= 1, got {num_experts}.')
  if merge_weights is not None and len(merge_weights) != num_experts:
    raise AlgorithmConfigError(
        f'merge_weights needs {num_experts} entries, got {len(merge_weights)}.')
  update = client_update(loss_fn, optimizer)

  def init(params):
    experts, opt_state = placed_init(optimizer, num_experts)(params)
    return BtmState(params, experts, opt_state, jnp.zeros((num_experts,), jnp.float32))

  def next(state, batches, weights, rng):
    clients = cohort_size(batches, fixed=(num_experts, 'experts (one domain each)'))

    @federated_program(clients=clients)
    def round_(state, batches, weights, rng):
      keys = jax.random.split(rng, clients)
      experts, opt_state, stats = federated_map(
          update, (state.experts, state.opt_state, batches, keys))
      seen = state.domain_examples + weights.astype(jnp.float32)
      mix = seen if merge_weights is None else jnp.asarray(merge_weights, jnp.float32)
      merged = jax.tree.map(lambda m, p: m.astype(p.dtype),
                            federated_weighted_mean(experts, mix), state.params)
      pseudo_grad = jax.tree.map(lambda p, m: p - m, state.params, merged)
      metrics = round_metrics(stats, weights, pseudo_grad, opt_state, clients)
      return BtmState(merged, experts, opt_state, seen), metrics

    return round_(state, batches, weights, rng)

  return Algorithm(init, next)


def ensemble_log_probs(apply_fn: Callable[[Any, jax.Array], jax.Array], expert_params: Any,
                       tokens: jax.Array, log_prior: jax.Array | None = None) -> jax.Array:
  """Log-probs [B, T, V] of the BTM ensemble's next-token distribution at every position.

  `apply_fn(params, tokens [B, T]) -> logits [B, T, V]` is a causal LM (position t predicts
  token t+1); `expert_params` are stacked experts (leading axis K, e.g. `state.experts`);
  `log_prior` is [K] (default uniform). At position t the experts are mixed with the domain
  posterior given the context x_0..x_t: posterior_k ∝ prior_k · Π_{1≤s≤t} p_k(x_s | x_<s)
  (x_0 is not scored), all in log space. Padding is not masked out of the context.
  """
  experts = jax.tree.leaves(expert_params)[0].shape[0]

  @federated_program(clients=experts)
  def expert_log_probs(expert_params, tokens):
    return federated_map(
        lambda p, t: jax.nn.log_softmax(apply_fn(p, t).astype(jnp.float32), axis=-1),
        (expert_params, federated_broadcast(tokens)))

  log_probs = expert_log_probs(expert_params, tokens)  # [K, B, T, V]
  observed = jnp.take_along_axis(
      log_probs[:, :, :-1], tokens[None, :, 1:, None], axis=-1)[..., 0]  # [K, B, T-1]
  context = jnp.concatenate(
      [jnp.zeros((*observed.shape[:-1], 1)), jnp.cumsum(observed, axis=-1)], axis=-1)  # [K, B, T]
  if log_prior is None:
    log_prior = jnp.zeros((experts,), jnp.float32)
  log_posterior = jnp.asarray(log_prior, jnp.float32)[:, None, None] + context
  log_posterior = log_posterior - jax.nn.logsumexp(log_posterior, axis=0, keepdims=True)
  return jax.nn.logsumexp(log_posterior[..., None] + log_probs, axis=0)
