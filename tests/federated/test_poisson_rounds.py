"""Poisson cohorts in the pseudo-gradient round: a round nobody joined leaves the server as it
was (no 0/0), `clients` counts the real clients, and the logged stats are theirs alone."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from paxlike.data import ImageData, sources
from paxlike.federated import fed_adam, fed_avg
from tests.federated.test_stragglers import ETA, linear_loss, masked_batches, numpy_round
from tests.federated.regression import initial_params, run_rounds


def poisson_batches(present: list[bool], seed: int = 1) -> dict:
  """Linear-regression batches whose padded slots (not `present`) run no step and hold junk,
  as a Poisson round's batches do."""
  return masked_batches([4 if p else 0 for p in present], seed)


def _empty_round(data: ImageData) -> int:
  """A step whose Poisson cohort is empty."""
  return next(s for s in range(1, 500)
              if np.all(sources.sample_cohort(0, s, data.client_sizes, 1, 'poisson') < 0))


def test_an_empty_poisson_round_is_all_padding():
  data = ImageData(num_clients=20, clients_per_round=1, sampling='poisson', local_steps=2,
                   batch_size=3)
  batch, weights = data.round_batches(0, _empty_round(data))
  assert np.all(weights == 0) and np.all(batch['mask'] == 0)
  assert np.all(batch[sources.STEP_MASK] == 0)


def test_a_round_nobody_joined_leaves_params_and_server_state_unchanged():
  params, batches = initial_params(), poisson_batches([False] * 5)
  for alg in (fed_avg(linear_loss, optax.sgd(ETA)),
              fed_adam(linear_loss, optax.sgd(ETA), server_learning_rate=0.1)):
    start = alg.init(params)
    state, metrics = jax.jit(alg.next)(start, batches, jnp.zeros(5), jax.random.key(0))
    for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(start)):
      assert np.array_equal(got, want)  # Not NaN (0/0), not a server-momentum step.
    assert all(np.isfinite(v) for v in jax.tree.leaves(metrics))
    assert int(metrics['clients']) == 0 and float(metrics['loss']) == 0.0


def test_fedadam_after_an_empty_round_is_fedadam_without_it():
  params, full = initial_params(), poisson_batches([True, False, True, True])
  alg, weights = fed_adam(linear_loss, optax.sgd(ETA), server_learning_rate=0.1), jnp.array(
      [2.0, 0.0, 1.0, 3.0])
  step = jax.jit(alg.next)
  state, _ = step(alg.init(params), poisson_batches([False] * 4), jnp.zeros(4),
                  jax.random.key(0))
  state, _ = step(state, full, weights, jax.random.key(1))
  alone, _ = step(alg.init(params), full, weights, jax.random.key(1))
  jax.tree.map(np.testing.assert_array_equal, state, alone)


def test_clients_counts_the_real_clients_of_a_poisson_round():
  data = ImageData(num_clients=40, clients_per_round=8, sampling='poisson', local_steps=2,
                   batch_size=3)
  cohort = sources.sample_cohort(0, 3, data.client_sizes, 8, 'poisson')
  present = cohort != sources.PADDED
  assert 0 < present.sum() < data.num_slots
  _, metrics = run_rounds(fed_avg(linear_loss, optax.sgd(ETA)), initial_params(), 1,
                    poisson_batches(list(present)), jnp.asarray(present, jnp.float32))
  assert int(metrics['clients']) == present.sum() and int(metrics['stragglers']) == 0


def test_logged_loss_and_update_are_the_real_clients_weighted_mean():
  present = [True, False, True, False, True]
  weights = np.array([2.0, 0.0, 1.0, 0.0, 3.0])
  params, batches = initial_params(), poisson_batches(present)
  state, metrics = run_rounds(fed_avg(linear_loss, optax.sgd(ETA)), params, 1, batches,
                        jnp.asarray(weights))
  steps = [4 if p else 0 for p in present]
  want = numpy_round(params, batches, steps, list(weights))
  for k in want:
    np.testing.assert_allclose(np.asarray(state.params[k]), want[k], rtol=2e-5, atol=2e-6)
  first = [np.mean((batches['x'][i, 0] @ np.asarray(params['w']) + float(params['b'])
                    - batches['y'][i, 0])**2) for i in range(5)]
  np.testing.assert_allclose(float(metrics['loss_before']), np.dot(weights, first) / 6,
                             rtol=1e-5)
