"""PAPA: PopulAtion Parameter Averaging (Jolicoeur-Martineau et al. 2023).

A population of models trains in parallel, member j on cohort slot j, each with its own
optimizer state; all of it is client-placed (leading axis = population) in the state. Every
`every` rounds the members are pulled together:

- `gradual` (PAPA): w_j ← α·w_j + (1 − α)·mean(w), the paper's default (α = 0.99).
- `all` (PAPA-all): every member is replaced by the mean.
- `pairs` (PAPA-2): the population is replaced by n children, each the average of a different
  random pair of members (drawn from the round's rng), so that n ≥ 3 members stay distinct
  (n = 2: both become the mean). A client-to-client exchange (a gather over the clients axis),
  outside the primitive set. The mean is kept only in expectation.

The period. `every` counts rounds, and a round is the batches' `local_steps` SGD steps of every
member. The paper averages `gradual` every few SGD steps (10 by default), so set
`every = 10 / local_steps`; it averages `all` and `pairs` every few epochs, so set `every = E ·
steps_per_epoch / local_steps` for every E epochs, where steps_per_epoch is a member's
examples over its batch size.

The start. By default each member starts from its own random init, member j's drawn from
`(seed, j)`, as in the paper's code (`Algorithm.seeded_init`, which the trainer calls); with
`same_init=True` (or through plain `init(params)`) all start at the same params and only
their data makes them diverge.

The averaging is computed in float32 and cast back, so that a 1% pull is not rounded away in
bfloat16. `state.params` is the population mean (the "soup"), which is what gets evaluated.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from paxlike.core.optim import learning_rate_of
from paxlike.core.algorithm import Algorithm, AlgorithmConfigError, FixedCohort, cast_like, cohort_size
from paxlike.federated.clients import client_update, cohort_metrics, placed_init
from paxlike.federated.chunking import resolve_client_chunk
from paxlike.federated.options import check_prox_mu, refuse_options
from paxlike.federated.primitives import (federated_broadcast, federated_map, federated_mean,
                                          federated_program)
from paxlike.core.loss import LossFn

VARIANTS = ('gradual', 'all', 'pairs')


class PapaState(NamedTuple):
  """`params`: the population mean; `population`/`opt_state`: per member, leading axis =
  population; `round`: int32 count of rounds done."""

  params: Any
  population: Any
  opt_state: Any
  round: jax.Array


def as_float32(tree: Any) -> Any:
  return jax.tree.map(lambda x: x.astype(jnp.promote_types(x.dtype, jnp.float32)), tree)


def population_mean(members: Any) -> Any:
  """The float32 (or wider) mean of the members (inside a federated program)."""
  return federated_mean(as_float32(members))


def pull_to_mean(members: Any, alpha: float) -> Any:
  """w_j ← α·w_j + (1 − α)·mean(w) for every member, in float32, cast back (inside a federated
  program)."""
  mean = federated_broadcast(population_mean(members))
  pulled = federated_map(
      lambda w, m: jax.tree.map(lambda a, b: alpha * a + (1 - alpha) * b, as_float32(w), m),
      (members, mean))
  return cast_like(pulled, members)


def random_pairs(size: int, rng: jax.Array) -> tuple[jax.Array, jax.Array]:
  """`size` pairs (first[j], second[j]) of distinct members, all different when there are
  enough pairs (size ≥ 3); with size = 2 both are the one pair."""
  pairs = np.array(list(itertools.combinations(range(size), 2)), np.int32).reshape(-1, 2)
  chosen = jax.random.choice(rng, len(pairs), (size,), replace=len(pairs) < size)
  return jnp.asarray(pairs[:, 0])[chosen], jnp.asarray(pairs[:, 1])[chosen]


def average_pairs(members: Any, rng: jax.Array) -> Any:
  """PAPA-2's children: member j replaced by the mean of random pair j (`random_pairs`)."""
  size = jax.tree.leaves(members)[0].shape[0]
  if size == 1:
    return members
  first, second = random_pairs(size, rng)
  children = jax.tree.map(lambda x: (x[first] + x[second]) / 2, as_float32(members))
  return cast_like(children, members)


def papa(loss_fn: LossFn, optimizer: optax.GradientTransformation, population: int,
         alpha: float = 0.99, every: int = 10, variant: str = 'gradual',
         same_init: bool = False, client_chunk: int | None = None, aggregator: None = None,
         prox_mu: float = 0.0) -> Algorithm:
  """PAPA over `population` members; averaging every `every` rounds (one round = the batches'
  local steps of training per member; see the module docstring for the paper's periods).
  `same_init`: all members start at the same params instead of their own random inits. Needs
  cohort size = population, slot j → member j. The round options (federated/options.py):
  `client_chunk`, members trained at a time; `prox_mu`, each member's local steps proximal to
  its start of round; no `aggregator` (members are averaged, not aggregated)."""
  if variant not in VARIANTS:
    raise AlgorithmConfigError(f'variant must be one of {VARIANTS}, got {variant!r}.')
  if population < 1 or every < 1 or not 0.0 <= alpha <= 1.0:
    raise AlgorithmConfigError(f'need population >= 1, every >= 1, 0 <= alpha <= 1; got '
                               f'{population}, {every}, {alpha}.')
  refuse_options('papa', 'members are averaged, not aggregated', aggregator)
  update = client_update(loss_fn, optimizer, check_prox_mu(prox_mu))

  def init(params):
    members, opt_state = placed_init(optimizer, population)(params)
    return PapaState(params, members, opt_state, jnp.zeros((), jnp.int32))

  @federated_program(clients=population)
  def seeded_init(init_params: Callable[[jax.Array], Any], rng: jax.Array) -> PapaState:
    """Member j starts from `init_params(jax.random.split(rng, population)[j])`."""
    members = federated_map(init_params, jax.random.split(rng, population))
    soup = cast_like(population_mean(members), members)
    opt_state = federated_map(optimizer.init, members)
    return PapaState(soup, members, opt_state, jnp.zeros((), jnp.int32))

  def average(members, rng):
    if variant == 'pairs':
      return average_pairs(members, rng)
    return pull_to_mean(members, 0.0 if variant == 'all' else alpha)

  def next(state, batches, weights, rng):
    clients = cohort_size(batches, fixed=(population, 'population members'))

    @federated_program(clients=clients)
    def round_(state, batches, weights, rng):
      train_rng, average_rng = jax.random.split(rng)
      keys = jax.random.split(train_rng, clients)
      members, opt_state, stats = federated_map(
          update, (state.population, state.opt_state, batches, keys),
          chunk=resolve_client_chunk(client_chunk))
      count = state.round + 1
      averaged = count % every == 0
      members = jax.lax.cond(averaged, average, lambda m, _: m, members, average_rng)
      soup = cast_like(population_mean(members), state.params)
      pseudo_grad = jax.tree.map(lambda p, s: p - s, state.params, soup)
      metrics = cohort_metrics(stats, weights, pseudo_grad, learning_rate_of(opt_state), clients)
      metrics['averaged'] = averaged.astype(jnp.int32)
      return PapaState(soup, members, opt_state, count), metrics

    return round_(state, batches, weights, rng)

  fixed = FixedCohort(population, 'population', False, lambda n: papa(
      loss_fn, optimizer, n, alpha, every, variant, same_init, client_chunk, aggregator, prox_mu))
  return Algorithm(init, next, seeded_init=None if same_init else seeded_init,
                   fixed_cohort=fixed)
