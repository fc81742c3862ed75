"""FedProx and SCAFFOLD against FedAvg and closed forms on quadratics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from paxlike.errors import UserError
from paxlike.federated import fed_avg
from paxlike.federated.scaffold import scaffold
from tests.federated.regression import client_batches, close, initial_params, loss_fn, run_rounds

# Client i's objective: f_i(w) = a_i/2 (w − b_i)², the same batch at every local step.
A, B = np.array([1.0, 4.0]), np.array([0.0, 1.0])
ETA, K = 0.1, 20


def quadratic_loss(params, batch, rng):
  del rng
  return jnp.sum(batch['a'] / 2 * (params['w'] - batch['b'])**2), {}


def quadratic_batches(steps: int = K):
  tile = lambda v: jnp.tile(jnp.asarray(v, jnp.float32)[:, None, None], (1, steps, 1))
  return {'a': tile(A), 'b': tile(B)}


def test_fedprox_with_mu_zero_is_fedavg():
  params, batches, weights = initial_params(), client_batches(3, 4), jnp.array([1.0, 2.0, 5.0])
  plain, _ = run_rounds(fed_avg(loss_fn, optax.adam(0.05)), params, 3, batches, weights)
  prox, _ = run_rounds(fed_avg(loss_fn, optax.adam(0.05), prox_mu=0.0), params, 3, batches, weights)
  close(prox.params, plain.params, rtol=0, atol=0)


def test_fedprox_round_matches_the_proximal_closed_form():
  mu, x = 0.5, 0.3
  alg = fed_avg(quadratic_loss, optax.sgd(ETA), prox_mu=mu)
  state, _ = run_rounds(alg, {'w': jnp.float32(x)}, 1, quadratic_batches(), jnp.ones(2))
  # SGD on a/2 (w − b)² + μ/2 (w − x)² contracts to w* = (ab + μx)/(a + μ) by 1 − η(a + μ).
  w_star = (A * B + mu * x) / (A + mu)
  clients = w_star + (1 - ETA * (A + mu))**K * (x - w_star)
  np.testing.assert_allclose(state.params['w'], clients.mean(), rtol=1e-5)


def test_scaffold_with_identical_clients_is_fedavg():
  params, one = initial_params(), client_batches(1, 3)
  many = jax.tree.map(lambda x: jnp.repeat(x, 4, axis=0), one)
  weights = jnp.ones((4,))
  avg, avg_metrics = run_rounds(fed_avg(loss_fn, optax.sgd(0.1)), params, 4, many, weights)
  sca, sca_metrics = run_rounds(scaffold(loss_fn, optax.sgd(0.1), num_clients=4), params, 4, many,
                          weights)
  close(sca.params, avg.params, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(sca_metrics['loss'], avg_metrics['loss'], rtol=1e-5)


def test_scaffold_converges_where_fedavg_drifts():
  optimum = (A * B).sum() / A.sum()  # argmin of f_1 + f_2.
  # FedAvg: client i ends at b_i + r_i (x − b_i), r_i = (1 − η a_i)^K, so its fixed point is
  # Σ(1 − r_i) b_i / Σ(1 − r_i): with many local steps, the clients' own optima's mean.
  r = (1 - ETA * A)**K
  fedavg_fixed_point = ((1 - r) * B).sum() / (1 - r).sum()
  assert abs(fedavg_fixed_point - optimum) > 0.2
  start, batches, weights = {'w': jnp.float32(-1.0)}, quadratic_batches(), jnp.ones(2)
  avg, _ = run_rounds(fed_avg(quadratic_loss, optax.sgd(ETA)), start, 100, batches, weights)
  sca, metrics = run_rounds(scaffold(quadratic_loss, optax.sgd(ETA), num_clients=2), start, 100,
                      batches, weights)
  np.testing.assert_allclose(avg.params['w'], fedavg_fixed_point, rtol=1e-4)
  np.testing.assert_allclose(sca.params['w'], optimum, rtol=1e-4)
  # At the optimum each client's control variate is its own gradient there, and c = 0.
  np.testing.assert_allclose(sca.client_controls['w'], A * (optimum - B), rtol=1e-3, atol=1e-5)
  np.testing.assert_allclose(sca.control['w'], 0.0, atol=1e-5)
  assert float(metrics['control_norm']) < 1e-4


def test_scaffold_refuses_a_cohort_other_than_its_population():
  alg = scaffold(quadratic_loss, optax.sgd(ETA), num_clients=3)
  with pytest.raises(UserError, match='clients_per_round = 3'):
    alg.next(alg.init({'w': jnp.float32(0.0)}), quadratic_batches(), jnp.ones(2),
             jax.random.key(0))
