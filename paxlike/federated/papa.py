"""PAPA: PopulAtion Parameter Averaging (Jolicoeur-Martineau et al. 2023).

A population of models trains in parallel, member j on cohort slot j, each with its own
optimizer state; all of it is client-placed (leading axis = population) in the state. Every
`every` rounds the members are pulled together:

- `gradual` (PAPA): w_j ← α·w_j + (1 − α)·mean(w), the paper's default (α = 0.99, every 10).
- `all` (PAPA-all): every member is replaced by the mean.
- `pairs` (PAPA-2): members are paired by a random permutation (from the round's rng) and each
  pair is replaced by its average; with an odd population one member is left alone. This is a
  client-to-client exchange (a gather over the clients axis), outside the primitive set.

`state.params` is the population mean (the "soup"), which is what gets evaluated. Members start
identical (the paper's default); different data per slot makes them diverge.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from paxlike.algorithm import Algorithm, AlgorithmConfigError, cast_like, cohort_size
from paxlike.federated.algorithms import client_update, cohort_metrics, placed_init
from paxlike.federated.primitives import (federated_broadcast, federated_map, federated_mean,
                                          federated_program)
from paxlike.losses import LossFn

VARIANTS = ('gradual', 'all', 'pairs')


class PapaState(NamedTuple):
  """`params`: the population mean; `population`/`opt_state`: per member, leading axis =
  population; `round`: int32 count of rounds done."""

  params: Any
  population: Any
  opt_state: Any
  round: jax.Array


def pull_to_mean(members: Any, alpha: float) -> Any:
  """w_j ← α·w_j + (1 − α)·mean(w) for every member (inside a federated program)."""
  mean = federated_broadcast(federated_mean(members))
  return federated_map(
      lambda w, m: cast_like(jax.tree.map(lambda a, b: alpha * a + (1 - alpha) * b, w, m), w),
      (members, mean))


def average_pairs(members: Any, rng: jax.Array) -> Any:
  """Each member replaced by the average of itself and its partner in a random pairing."""
  size = jax.tree.leaves(members)[0].shape[0]
  perm = jax.random.permutation(rng, size)
  first, second = perm[0:size - 1:2], perm[1:size:2]
  partner = jnp.arange(size).at[first].set(second).at[second].set(first)
  return jax.tree.map(lambda x: ((x + x[partner]) / 2).astype(x.dtype), members)


def papa(loss_fn: LossFn, optimizer: optax.GradientTransformation, population: int,
         alpha: float = 0.99, every: int = 10, variant: str = 'gradual',
         client_chunk: int | None = None) -> Algorithm:
  """PAPA over `population` members; averaging every `every` rounds (one round = the batches'
  local steps of training per member). Needs cohort size = population, slot j → member j.
  `client_chunk`: members trained at a time (`federated_map(chunk=)`; None: all at once)."""
  if variant not in VARIANTS:
    raise AlgorithmConfigError(f'variant must be one of {VARIANTS}, got {variant!r}.')
  if population < 1 or every < 1 or not 0.0 <= alpha <= 1.0:
    raise AlgorithmConfigError(f'need population >= 1, every >= 1, 0 <= alpha <= 1; got '
                               f'{population}, {every}, {alpha}.')
  update = client_update(loss_fn, optimizer)

  def init(params):
    members, opt_state = placed_init(optimizer, population)(params)
    return PapaState(params, members, opt_state, jnp.zeros((), jnp.int32))

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
          update, (state.population, state.opt_state, batches, keys), chunk=client_chunk)
      count = state.round + 1
      averaged = count % every == 0
      members = jax.lax.cond(averaged, average, lambda m, _: m, members, average_rng)
      soup = cast_like(federated_mean(members), state.params)
      pseudo_grad = jax.tree.map(lambda p, s: p - s, state.params, soup)
      metrics = cohort_metrics(stats, weights, pseudo_grad, opt_state, clients)
      metrics['averaged'] = averaged.astype(jnp.int32)
      return PapaState(soup, members, opt_state, count), metrics

    return round_(state, batches, weights, rng)

  return Algorithm(init, next)
