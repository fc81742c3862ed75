"""DP aggregation (clip, sum, noise, divide) and adaptive clipping, against hand computations."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from paxlike.errors import UserError
from paxlike.federated import diloco, fed_adam, fed_avg, federated_program
from paxlike.federated.dp import DpAggregator
from tests.federated.regression import client_batches, close, initial_params, loss_fn, run_rounds


def _aggregate(aggregator, deltas, rng=jax.random.key(0), clip_norm=None):
  """One aggregation of client-placed `deltas` (leading axis = clients)."""
  clients = jax.tree.leaves(deltas)[0].shape[0]
  state = aggregator.init(None)
  if clip_norm is not None:
    state = state._replace(clip_norm=jnp.float32(clip_norm))
  weights = jnp.ones((clients,))
  return federated_program(clients=clients)(aggregator.aggregate)(state, deltas, weights, rng)


@pytest.mark.parametrize('builder', ['fed_avg', 'fed_adam', 'diloco'])
def test_no_noise_and_no_clipping_is_the_plain_algorithm(builder):
  params, batches, weights = initial_params(), client_batches(4, 3), jnp.full((4,), 5.0)
  make = {'fed_avg': lambda **kw: fed_avg(loss_fn, optax.sgd(0.1), **kw),
          'fed_adam': lambda **kw: fed_adam(loss_fn, optax.sgd(0.1), **kw),
          'diloco': lambda **kw: diloco(loss_fn, optax.adam(0.05), num_replicas=4, **kw)}
  plain, plain_metrics = run_rounds(make[builder](), params, 3, batches, weights)
  private = DpAggregator(clip_norm=math.inf, noise_multiplier=0.0)
  dp, dp_metrics = run_rounds(make[builder](aggregator=private), params, 3, batches, weights)
  close(dp.params, plain.params, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(dp_metrics['loss'], plain_metrics['loss'], rtol=1e-6)
  assert float(dp_metrics['dp_clip_norm']) == math.inf


def test_every_contribution_is_clipped_to_the_norm():
  clip_norm, scales = 0.5, jnp.array([1e6, 3e4, 0.1, 1e8])
  directions = jax.random.normal(jax.random.key(3), (4, 7))
  deltas = {'w': directions * scales[:, None], 'b': scales}
  aggregator = DpAggregator(clip_norm=clip_norm, noise_multiplier=0.0)
  mean, _, _ = _aggregate(aggregator, deltas)
  # Independently: each client's delta scaled to norm min(‖Δ‖, C), then averaged.
  flat = np.concatenate([np.asarray(deltas['w'], np.float64),
                         np.asarray(deltas['b'], np.float64)[:, None]], axis=1)
  norms = np.linalg.norm(flat, axis=1)
  clipped = flat * np.minimum(1.0, clip_norm / norms)[:, None]
  assert np.all(np.linalg.norm(clipped, axis=1) <= clip_norm * (1 + 1e-6))
  expected = clipped.mean(axis=0)
  np.testing.assert_allclose(mean['w'], expected[:7], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(mean['b'], expected[7], rtol=1e-5)
  # The small client (norm ≈ 0.1·‖direction‖ < C) is left as it was.
  assert norms[2] < clip_norm


def test_noise_std_is_z_times_clip_over_cohort():
  z, clip_norm, clients, seeds = 1.3, 0.7, 4, 2000
  aggregator = DpAggregator(clip_norm=clip_norm, noise_multiplier=z)
  deltas = {'w': jnp.zeros((clients, 5)), 'b': jnp.zeros((clients,))}
  keys = jax.random.split(jax.random.key(11), seeds)
  means = jax.jit(jax.vmap(lambda k: _aggregate(aggregator, deltas, k)[0]))(keys)
  samples = np.concatenate([np.asarray(means['w']).ravel(), np.asarray(means['b'])])
  assert abs(samples.std() / (z * clip_norm / clients) - 1) < 0.05
  assert abs(samples.mean()) < 3 * z * clip_norm / clients / math.sqrt(samples.size)


def test_noise_comes_from_the_round_key():
  aggregator = DpAggregator(clip_norm=1.0, noise_multiplier=1.0)
  deltas = {'w': jnp.ones((3, 4))}
  a = _aggregate(aggregator, deltas, jax.random.key(1))[0]['w']
  b = _aggregate(aggregator, deltas, jax.random.key(1))[0]['w']
  c = _aggregate(aggregator, deltas, jax.random.key(2))[0]['w']
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c)


def test_adaptive_clip_norm_moves_geometrically_to_the_common_norm():
  s, c0, eta, clients = 2.0, 0.25, 0.2, 5
  deltas = {'w': jnp.tile(jnp.array([s, 0.0, 0.0]), (clients, 1))}  # Every norm is s.
  aggregator = DpAggregator(clip_norm=c0, noise_multiplier=0.0, target_quantile=0.5,
                            clip_learning_rate=eta, count_stddev=0.0)
  state, norms = aggregator.init(None), []
  for _ in range(40):
    _, state, metrics = federated_program(clients=clients)(aggregator.aggregate)(
        state, deltas, jnp.ones((clients,)), jax.random.key(0))
    norms.append(float(state.clip_norm))
  # Paper: C ← C·exp(−η(b̄ − γ)); every norm is above C (b̄ = 0) until C passes s, so C grows
  # by exp(η/2) a round for ⌈log(s/c0)/(η/2)⌉ rounds, then b̄ = 1 and it shrinks by the same.
  rounds_up = math.ceil(math.log(s / c0) / (eta / 2))
  np.testing.assert_allclose(norms[:rounds_up], c0 * np.exp(eta / 2 * np.arange(1, rounds_up + 1)),
                             rtol=1e-5)
  tail = np.array(norms[rounds_up:])
  assert np.all((tail > s * math.exp(-eta / 2) * (1 - 1e-5)) & (tail < s * math.exp(eta / 2)))
  assert float(metrics['dp_unclipped_fraction']) in (0.0, 1.0)


def test_adaptive_noise_split_composes_to_the_configured_multiplier():
  aggregator = DpAggregator(noise_multiplier=1.2, target_quantile=0.5, count_stddev=2.0)
  z_update = aggregator.update_noise_multiplier(clients=40)
  assert z_update > 1.2
  assert math.isclose((z_update**-2 + (2 * 2.0)**-2)**-0.5, 1.2)
  assert aggregator.count_noise(40) == 2.0
  assert DpAggregator(target_quantile=0.5).count_noise(40) == 2.0  # The paper's m/20.
  with pytest.raises(UserError, match='2 \\* count_stddev > noise_multiplier'):
    DpAggregator(noise_multiplier=1.0, target_quantile=0.5).update_noise_multiplier(clients=5)


@pytest.mark.parametrize('field, value', [('noise_multiplier', -0.1), ('clip_norm', 0.0),
                                          ('clip_norm', -1.0), ('delta', 0.0), ('delta', 1.0),
                                          ('target_quantile', 1.5), ('accountant', 'moments')])
def test_bad_settings_are_user_errors(field, value):
  with pytest.raises(UserError, match=field.split('_')[0]):
    DpAggregator(**{field: value})
