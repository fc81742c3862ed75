"""Branch-Train-Merge (Li et al. 2022): experts branch from a seed model and train on one domain
each; the result is their (weighted) parameter average, or an ensemble weighted by the domain
posterior (its math is in paxlike/federated/ensemble.py, where evaluation uses it).

The seed is the params passed to `init`, or, with `seed_steps` = S > 0, those trained for the
first S rounds as ONE model on the pooled data of all cohort slots (the paper's seed phase):
local step l is one optimizer update on all slots' step-l batches concatenated along the batch
axis (the loss_fn's masked mean over the pooled batch; the slot weights are not used). After
every seed round the experts are reset to the seed with fresh optimizer states, so round S + 1
branches from it exactly. One compiled step serves both phases (`lax.cond` on the round count).
The seed round trains on all slots' batches at once, so `client_chunk` does not bound its
memory (nor, since `lax.cond` reserves the larger branch, the experts' rounds' with a seed).

Expert k trains only on cohort slot k (the data side feeds domain k's batches there every
round), with its own optimizer state; experts and states are client-placed (leading axis =
experts). `state.params` is the current model: the seed during the seed phase, then the merged
experts: their weighted parameter average with `merge_weights`, or by default with the examples
each domain has seen so far.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from paxlike.core.optim import learning_rate_of
from paxlike.core.algorithm import (Algorithm, AlgorithmConfigError, FixedCohort, cast_like,
                                    check_weighting, client_weights, cohort_size)
from paxlike.federated.clients import client_update, cohort_metrics, placed_init, round_metrics
from paxlike.federated.chunking import resolve_client_chunk
from paxlike.federated.options import check_prox_mu, refuse_options
from paxlike.federated.primitives import federated_map, federated_program, federated_weighted_mean
from paxlike.core.loss import LossFn


class BtmState(NamedTuple):
  """`params`: the seed model during the seed phase, then the merged experts;
  `experts`/`opt_state`: per expert, leading axis = experts; `domain_examples`: float32
  [experts], the example weights each expert has trained on; `round`: int32 count of rounds
  done; `seed_opt_state`: the seed model's optimizer state (`optax.EmptyState()` when
  seed_steps = 0)."""

  params: Any
  experts: Any
  opt_state: Any
  domain_examples: jax.Array
  round: jax.Array
  seed_opt_state: Any


def pool(batches: Any) -> Any:
  """[clients, local_steps, B, ...] → [local_steps, clients·B, ...]: step l is every slot's
  step-l batch, concatenated along the batch axis in slot order."""
  return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1).reshape(x.shape[1], -1, *x.shape[3:]),
                      batches)


def check_btm_args(num_experts: int, merge_weights: Sequence[float] | None,
                   seed_steps: int) -> None:
  if num_experts < 1:
    raise AlgorithmConfigError(f'num_experts must be >= 1, got {num_experts}.')
  if merge_weights is not None and len(merge_weights) != num_experts:
    raise AlgorithmConfigError(
        f'merge_weights needs {num_experts} entries, got {len(merge_weights)}.')
  if merge_weights is not None and (min(merge_weights) < 0 or sum(merge_weights) <= 0):
    raise AlgorithmConfigError(
        f'merge_weights must be >= 0 with a positive sum, got {tuple(merge_weights)}.')
  if seed_steps < 0:
    raise AlgorithmConfigError(f'seed_steps must be >= 0, got {seed_steps}.')


def seed_round(update: Any, branch: Any, like: dict[str, Any], state: BtmState, batches: Any,
               weights: jax.Array, rng: jax.Array) -> tuple[BtmState, dict[str, jax.Array]]:
  """A seed-phase round: one model's local steps on the pooled slots' batches (`update`), then
  the experts reset to it (`branch`); metrics typed `like` the expert rounds' (lax.cond)."""
  del weights  # The pooled batch's masked mean weighs the slots.
  params, seed_opt_state, stats = update(state.params, state.seed_opt_state, pool(batches), rng)
  pseudo_grad = jax.tree.map(lambda p, n: p - n, state.params, params)
  clients = jax.tree.leaves(batches)[0].shape[0]
  metrics = round_metrics(stats, pseudo_grad, learning_rate_of(seed_opt_state), clients)
  experts, opt_state = branch(params)
  return BtmState(params, experts, opt_state, jnp.zeros_like(state.domain_examples),
                  state.round + 1, seed_opt_state), cast_like(metrics, like)


def expert_ensemble(merge_weights: Sequence[float] | None, state: BtmState
                    ) -> tuple[Any, jax.Array]:
  """The experts, with a domain prior ∝ the merge weights (uniform before any training)."""
  mix = (state.domain_examples if merge_weights is None
         else jnp.asarray(merge_weights, jnp.float32))
  mix = jnp.where(mix.sum() > 0, mix, jnp.ones_like(mix))
  return state.experts, jnp.log(mix / mix.sum())


def btm(loss_fn: LossFn, optimizer: optax.GradientTransformation, num_experts: int,
        merge_weights: Sequence[float] | None = None, seed_steps: int = 0,
        client_chunk: int | None = None, weighting: str = 'num_examples', aggregator: None = None,
        prox_mu: float = 0.0) -> Algorithm:
  """BTM with `num_experts` experts branched from the seed: the params passed to `init`, trained
  centrally on the pooled cohort for the first `seed_steps` rounds. Needs cohort size =
  num_experts, slot k → domain k. Each later round trains every expert for the batches' local
  steps, then merges. `weighting`: what a round adds to each domain's count
  (paxlike.core.algorithm.WEIGHTINGS). The round options (federated/options.py): `client_chunk`,
  experts trained at a time; `prox_mu`, every local run (seed and expert) proximal to its
  start of round; no `aggregator` (experts are merged by their weights, not aggregated)."""
  check_btm_args(num_experts, merge_weights, seed_steps)
  check_weighting(weighting)
  refuse_options('btm', 'experts are merged by their weights, not aggregated', aggregator)
  update = client_update(loss_fn, optimizer, check_prox_mu(prox_mu))
  branch = placed_init(optimizer, num_experts)

  def init(params):
    experts, opt_state = branch(params)
    seed_opt_state = optimizer.init(params) if seed_steps else optax.EmptyState()
    return BtmState(params, experts, opt_state, jnp.zeros((num_experts,), jnp.float32),
                    jnp.zeros((), jnp.int32), seed_opt_state)

  def next(state, batches, weights, rng):
    clients = cohort_size(batches, fixed=(num_experts, 'experts (one domain each)'))
    weights = client_weights(weighting, batches, weights)

    @federated_program(clients=clients)
    def expert_round(state, batches, weights, rng):
      keys = jax.random.split(rng, clients)
      experts, opt_state, stats = federated_map(
          update, (state.experts, state.opt_state, batches, keys),
          chunk=resolve_client_chunk(client_chunk))
      seen = state.domain_examples + weights
      mix = seen if merge_weights is None else jnp.asarray(merge_weights, jnp.float32)
      merged = jax.tree.map(lambda m, p: m.astype(p.dtype),
                            federated_weighted_mean(experts, mix), state.params)
      pseudo_grad = jax.tree.map(lambda p, m: p - m, state.params, merged)
      metrics = cohort_metrics(stats, weights, pseudo_grad, learning_rate_of(opt_state), clients)
      return state._replace(params=merged, experts=experts, opt_state=opt_state,
                            domain_examples=seen, round=state.round + 1), metrics

    if not seed_steps:
      return expert_round(state, batches, weights, rng)

    like = jax.eval_shape(expert_round, state, batches, weights, rng)[1]  # lax.cond: same types.
    seed = functools.partial(seed_round, update, branch, like)
    return jax.lax.cond(state.round < seed_steps, seed, expert_round,
                        state, batches, weights, rng)

  fixed = FixedCohort(num_experts, 'num_experts', False, lambda n: btm(
      loss_fn, optimizer, n, merge_weights, seed_steps, client_chunk, weighting, aggregator,
      prox_mu))
  return Algorithm(init, next, functools.partial(expert_ensemble, merge_weights),
                   fixed_cohort=fixed, pools_cohort=seed_steps > 0)
