"""Partial work in a round: stragglers and a Poisson cohort's padded slots.

The data marks which local steps each slot runs (`sources.STEP_MASK`), only where some slot
may run fewer than all: `data.straggler_fraction` > 0 (a straggler runs its first 1 to
local_steps - 1 steps, as in Li et al. 2020's systems heterogeneity) or `data.sampling=
'poisson'` (a padded slot runs none). Without it every function here is unused and a round is
what it was. With it:
- a local step a client does not run is no step: no parameter or optimizer-state update
  (masked inside the client's `lax.scan`, so shapes stay fixed; `split_steps`, `keep_if`), and
  the client's stats average over the steps it ran (`run_stats`);
- a straggler's partial work is dropped (weight 0 in the aggregate: FedAvg, the FedProx
  paper's baseline) or kept (FedProx), by the builder's `drop_stragglers`
  (options.drop_stragglers_of: by default dropped unless prox_mu > 0); `round_weights`;
- the round's `clients` and `stragglers` count real clients, and its logged stats (loss, ...)
  are their weighted mean, stragglers included (`real_client_mean`);
- a round whose aggregate holds no client (nobody sampled, or every one dropped) leaves the
  server params and server optimizer state as they were instead of FedAvg's 0/0
  (`guarded_mean`, then `keep_if`). Under DP the noised step is still taken: its guarantee
  needs the release every round.
Nothing here reduces across clients but the federated sums, and every guard is applied on the
server after them, so such a round still exports as one broadcast → clients → aggregation.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from paxlike.core.batch import STEP_MASK
from paxlike.federated.primitives import federated_sum, federated_weighted_sums
from paxlike.core.algorithm import step_runs


def split_steps(batches: Any) -> tuple[Any, jax.Array | None]:
  """One client's (batches without the STEP_MASK, bool [local_steps]: the steps it runs), or
  (batches, None) where the batches have no STEP_MASK."""
  if not isinstance(batches, dict) or STEP_MASK not in batches:
    return batches, None
  runs = batches[STEP_MASK]
  rest = {k: v for k, v in batches.items() if k != STEP_MASK}
  return rest, jnp.max(runs.reshape(runs.shape[0], -1), axis=1) > 0


def keep_if(skip: jax.Array, old: Any, new: Any) -> Any:
  """`old` where `skip` (a bool scalar), else `new`, leaf by leaf."""
  return jax.tree.map(lambda o, n: jnp.where(skip, o, n), old, new)


def run_stats(losses: jax.Array, aux: Any, active: jax.Array) -> dict[str, jax.Array]:
  """A client's `loss` and aux values averaged over the local steps it ran, and `loss_before`
  (its first step's; a client runs at least one, a padded slot none and reports 0)."""
  count = jnp.maximum(jnp.sum(active), 1).astype(jnp.float32)
  mean = lambda v: jnp.sum(jnp.where(active.reshape(-1, *[1] * (v.ndim - 1)), v, 0),
                           axis=0) / count
  return {**jax.tree.map(mean, aux), 'loss': mean(losses),
          'loss_before': jnp.where(active[0], losses[0], 0.0)}


def last_run(batches: Any, keys: jax.Array, active: jax.Array) -> tuple[Any, jax.Array]:
  """The batch and key of the last local step a client ran (the first for a padded slot)."""
  last = jnp.maximum(jnp.sum(active) - 1, 0)
  return jax.tree.map(lambda x: x[last], batches), keys[last]


def round_weights(batches: Any, weights: jax.Array, drop: bool
                  ) -> tuple[jax.Array | None, jax.Array, jax.Array | None]:
  """(present bool [clients] or None, the aggregate's weights, straggled bool [clients] or
  None) of a round whose client weights are `weights`: without a STEP_MASK, (None, weights,
  None); with one, a straggler (a client that ran fewer than all local steps) gets weight 0
  if `drop`. All per client (nothing here reduces across clients)."""
  runs = step_runs(batches)
  if runs is None:
    return None, weights, None
  steps = jnp.sum(runs, axis=1)
  present, straggled = steps > 0, (steps > 0) & (steps < runs.shape[1])
  return present, jnp.where(straggled, 0.0, weights) if drop else weights, straggled


def counts(present: jax.Array | None, straggled: jax.Array | None) -> dict[str, jax.Array]:
  """The round's `clients` (real ones) and `stragglers` (nothing without a STEP_MASK: None);
  call inside its federated program."""
  if present is None:
    return {}
  return {'clients': federated_sum(present.astype(jnp.int32)),
          'stragglers': federated_sum(straggled.astype(jnp.int32))}


def guarded_mean(x: Any, weights: jax.Array, fallback: Any) -> tuple[Any, jax.Array]:
  """(Σᵢ wᵢxᵢ / Σᵢ wᵢ, or `fallback` where every weight is 0; whether they all are), with the
  sums taken over the clients and the guard applied on the server after them, so the round
  stays one broadcast → clients → aggregation (exportable). Call inside the federated
  program; `fallback` is a server value shaped like one client's `x`."""
  sums, total = federated_weighted_sums(x, weights)
  empty = total == 0
  mean = jax.tree.map(lambda s, f: jnp.where(empty, f.astype(s.dtype),
                                             s / jnp.where(empty, 1.0, total)), sums, fallback)
  return mean, empty


def real_client_mean(stats: Any, weights: jax.Array, present: jax.Array) -> Any:
  """Client-placed `stats` averaged with `weights` over the real clients (`present`); zeros
  in a round without any. Call inside the round's federated program."""
  zeros = jax.tree.map(lambda v: jnp.zeros(v.shape[1:], v.dtype), stats)
  return guarded_mean(stats, jnp.where(present, weights, 0.0), zeros)[0]

