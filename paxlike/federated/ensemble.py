"""Ensembles of stacked models (e.g. BTM's experts): their mixed predictive distributions.

For evaluation and decoding, which need an algorithm's ensemble but not the algorithm: a
classifier's experts are mixed by their prior, an LM's by the domain posterior given the context.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from paxlike.federated.primitives import federated_broadcast, federated_map, federated_program


def expert_log_probs(apply_fn: Callable[[Any, jax.Array], jax.Array], expert_params: Any,
                     inputs: jax.Array) -> jax.Array:
  """float32 log-softmax of every expert's outputs on the same `inputs`: [K, *outputs]."""
  experts = jax.tree.leaves(expert_params)[0].shape[0]

  @federated_program(clients=experts)
  def run(expert_params, inputs):
    return federated_map(
        lambda p, x: jax.nn.log_softmax(apply_fn(p, x).astype(jnp.float32), axis=-1),
        (expert_params, federated_broadcast(inputs)))

  return run(expert_params, inputs)


def mixture_log_probs(apply_fn: Callable[[Any, jax.Array], jax.Array], expert_params: Any,
                      inputs: jax.Array, log_prior: jax.Array) -> jax.Array:
  """Log-probs [B, C] of the prior-weighted mixture of the experts' predictive distributions:
  the ensemble for inputs without a context to infer the domain from (e.g. images)."""
  log_probs = expert_log_probs(apply_fn, expert_params, inputs)  # [K, B, C]
  prior = jnp.asarray(log_prior, jnp.float32).reshape(-1, *[1] * (log_probs.ndim - 1))
  return jax.nn.logsumexp(prior + log_probs, axis=0)


def ensemble_log_probs(apply_fn: Callable[[Any, jax.Array], jax.Array], expert_params: Any,
                       tokens: jax.Array, log_prior: jax.Array | None = None) -> jax.Array:
  """Log-probs [B, T, V] of the BTM ensemble's next-token distribution at every position.

  `apply_fn(params, tokens [B, T]) -> logits [B, T, V]` is a causal LM (position t predicts
  token t+1); `expert_params` are stacked experts (leading axis K, e.g. `state.experts`);
  `log_prior` is [K] (default uniform). At position t the experts are mixed with the domain
  posterior given the context x_0..x_t: posterior_k ∝ prior_k · Π_{1≤s≤t} p_k(x_s | x_<s)
  (x_0 is not scored), all in log space. Padding is not masked out of the context.
  """
  log_probs = expert_log_probs(apply_fn, expert_params, tokens)  # [K, B, T, V]
  experts = log_probs.shape[0]
  observed = jnp.take_along_axis(
      log_probs[:, :, :-1], tokens[None, :, 1:, None], axis=-1)[..., 0]  # [K, B, T-1]
  context = jnp.concatenate(
      [jnp.zeros((*observed.shape[:-1], 1)), jnp.cumsum(observed, axis=-1)], axis=-1)  # [K, B, T]
  if log_prior is None:
    log_prior = jnp.zeros((experts,), jnp.float32)
  log_posterior = jnp.asarray(log_prior, jnp.float32)[:, None, None] + context
  log_posterior = log_posterior - jax.nn.logsumexp(log_posterior, axis=0, keepdims=True)
  return jax.nn.logsumexp(log_posterior[..., None] + log_probs, axis=0)
