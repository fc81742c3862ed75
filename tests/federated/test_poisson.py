"""Poisson cohorts (data.sampling='poisson') in rounds: padded slots, DP aggregation over them,
and the accountant, each against an independent computation. The sampler's own statistics
(cohort sizes, membership, the slot cap) are pinned in tests/data/test_poisson_sampling.py."""

from __future__ import annotations

import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from paxlike import registry
from paxlike.config import config_io
from paxlike.data import ImageData
from paxlike.data import sources
from paxlike.errors import UserError
from paxlike.trainer.task import check_fixed_cohort
from paxlike.federated import diloco, fed_avg, federated_program
from paxlike.trainer import privacy
from paxlike.federated.scaffold import scaffold
from paxlike.federated.dp import DpAggregator
from tests.federated.regression import client_batches, close, initial_params, loss_fn, run_rounds
from tests.helpers import metric_rows, run_cli

N, K = 400, 100  # DigitsDpFedAvg's population and expected cohort.


def _task(exp: str, *overrides: str):
  registry.import_all()
  cfg = registry.get(exp)().config()
  config_io.apply_overrides(cfg, list(overrides))
  return config_io.build(cfg)


def _direct_epsilon(q: float, z: float, rounds: int, delta: float) -> float:
  ledger = dp_accounting.rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
  event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
  return ledger.compose(event, rounds).get_epsilon(delta)


def test_epsilon_is_dp_accountings_poisson_gaussian():
  task = _task('federated.DigitsDpFedAvg', 'data.sampling="poisson"')
  acc = privacy.accountant(task)
  assert (acc.sampling, acc.clients_per_round, acc.population, acc.delta) == (
      'poisson', K, N, 1e-5)
  for rounds in (1, 3, 100):
    assert acc.epsilon(rounds) == pytest.approx(_direct_epsilon(K / N, 6.0, rounds, 1e-5),
                                                rel=1e-12)
  uniform = privacy.accountant(_task('federated.DigitsDpFedAvg'))
  assert acc.epsilon(100) == pytest.approx(1.83, abs=0.01)
  assert uniform.epsilon(100) == pytest.approx(9.17, abs=0.01)
  assert 'poisson sampling (q = 0.25) of 100 expected of 400 clients' in acc.describe(100)
  assert privacy.round_metrics(acc, 3) == {'dp_epsilon': acc.epsilon(3), 'dp_delta': 1e-5,
                                           'dp_poisson_rate': 0.25}
  # The divisor qN is given where the run's algorithm is built, not by the accountant.
  assert privacy.aggregator_of(task.built_algorithm).expected_clients is None
  rebuilt = privacy.cohort_bound(task).algorithm(loss_fn, optax.sgd(0.1))
  assert privacy.aggregator_of(rebuilt).expected_clients == K


def test_round_batches_pad_with_zero_weight_and_mask_and_are_pure_in_seed_and_step():
  data = ImageData(num_clients=40, clients_per_round=8, sampling='poisson', local_steps=2,
                   batch_size=3)
  batch, weights = data.round_batches(5, 7)
  cohort = sources.sample_cohort(5, 7, data.client_sizes, 8, 'poisson')
  present = cohort != sources.PADDED
  assert batch['inputs'].shape[:3] == (data.num_slots, 2, 3) and len(weights) == data.num_slots
  assert np.array_equal(weights, np.where(present, data.client_sizes[np.maximum(cohort, 0)], 0))
  assert np.all(batch['mask'][~present] == 0) and np.all(batch['mask'][present] == 1)
  again, again_weights = data.round_batches(5, 7)
  assert all(np.array_equal(batch[k], again[k]) for k in batch)
  assert np.array_equal(weights, again_weights)
  block, _ = data.round_batches(5, 7, clients=slice(2, 6), rows=slice(1, 3))
  assert np.array_equal(block['inputs'], batch['inputs'][2:6, :, 1:3])
  other = [sources.sample_cohort(5, s, data.client_sizes, 8, 'poisson') for s in (8, 9)]
  assert not all(np.array_equal(cohort, o) for o in other)
  assert not np.array_equal(cohort, sources.sample_cohort(6, 7, data.client_sizes, 8, 'poisson'))


def _dp_aggregate(aggregator, deltas, weights, rng):
  clients = deltas.shape[0]
  return federated_program(clients=clients)(aggregator.aggregate)(
      aggregator.init(None), {'w': deltas}, weights, rng)


def test_padded_slots_take_no_part_and_the_sum_is_divided_by_qn():
  clip, expected = 0.5, 5.0
  real = np.array(jax.random.normal(jax.random.key(0), (4, 7))) * np.array([[3], [0.1], [1], [9]])
  junk = np.full((2, 7), 1e3, np.float32)  # Padded slots: whatever they hold is ignored.
  padded = jnp.asarray(np.concatenate([real[:2], junk[:1], real[2:], junk[1:]]))
  weights = jnp.array([3.0, 1.0, 0.0, 2.0, 7.0, 0.0])
  norms = np.linalg.norm(real, axis=1)
  clipped = real * np.minimum(1, clip / norms)[:, None]
  exact = DpAggregator(clip_norm=clip, noise_multiplier=0.0, target_quantile=0.5,
                       count_stddev=0.0, expected_clients=expected)
  mean, state, metrics = _dp_aggregate(exact, padded, weights, jax.random.key(1))
  np.testing.assert_allclose(mean['w'], clipped.sum(axis=0) / expected, rtol=1e-5, atol=1e-7)
  fraction = np.sum((norms <= clip) - 0.5) / expected + 0.5
  np.testing.assert_allclose(metrics['dp_unclipped_fraction'], fraction, rtol=1e-6)
  np.testing.assert_allclose(state.clip_norm, clip * np.exp(-0.2 * (fraction - 0.5)), rtol=1e-6)
  assert float(metrics['dp_cohort_size']) == 4
  # With noise: the same key gives the same aggregate as the real clients alone.
  noisy = DpAggregator(clip_norm=clip, noise_multiplier=2.0, target_quantile=0.5,
                       count_stddev=3.0, expected_clients=expected)
  got = _dp_aggregate(noisy, padded, weights, jax.random.key(2))
  alone = _dp_aggregate(noisy, jnp.asarray(real), jnp.ones(4), jax.random.key(2))
  close(got[0], alone[0], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(got[1].clip_norm, alone[1].clip_norm, rtol=1e-6)
  assert not np.allclose(got[0]['w'], mean['w'])


def test_fedavg_weighted_mean_ignores_padded_slots():
  params, real, weights = initial_params(), client_batches(3, 2), jnp.array([4.0, 1.0, 2.0])
  junk = jax.tree.map(lambda x: 50 * jnp.ones_like(x[:2]), real)
  padded = jax.tree.map(lambda r, j: jnp.concatenate([r[:1], j, r[1:]]), real, junk)
  alg = fed_avg(loss_fn, optax.sgd(0.05))
  state, _ = run_rounds(alg, params, 2, padded, jnp.array([4.0, 0.0, 0.0, 1.0, 2.0]))
  alone, _ = run_rounds(alg, params, 2, real, weights)
  close(state.params, alone.params)


class _PoissonData:
  clients_per_round, sampling = 4, 'poisson'


def test_fixed_cohort_algorithms_refuse_poisson():
  with pytest.raises(UserError, match="sampling='fixed', not 'poisson'"):
    check_fixed_cohort(scaffold(loss_fn, optax.sgd(0.1), num_clients=4), _PoissonData())


def test_fixed_cohort_without_per_client_state_refuses_poisson():
  with pytest.raises(UserError, match='poisson'):
    check_fixed_cohort(diloco(loss_fn, optax.sgd(0.1), num_replicas=4), _PoissonData())


@pytest.mark.slow
def test_cli_run_rows_carry_the_poisson_epsilon(tmp_path):
  sets = ['data.sampling="poisson"', 'train.num_steps=3', 'train.log_every=1',
          'train.eval_every=3', 'train.checkpoint_every=3']
  run_cli('--exp=federated.DigitsDpFedAvg', *[f'--fdl_set={s}' for s in sets],
          f'--job_log_dir={tmp_path}')
  rows, acc = metric_rows(tmp_path), privacy.accountant(_task('federated.DigitsDpFedAvg',
                                                              *sets))
  assert [r['step'] for r in rows] == [1, 2, 3]
  assert [r['dp_epsilon'] for r in rows] == [acc.epsilon(s) for s in (1, 2, 3)]
  assert all(r['dp_poisson_rate'] == 0.25 and math.isfinite(r['loss']) for r in rows)
  cohort = [sources.sample_cohort(0, s, np.ones(N), K, 'poisson') for s in (1, 2, 3)]
  assert [r['dp_cohort_size'] for r in rows] == [float((c >= 0).sum()) for c in cohort]
  assert [r['clients'] for r in rows] == [int((c >= 0).sum()) for c in cohort]  # Not slots.
