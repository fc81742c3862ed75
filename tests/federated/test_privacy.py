"""The privacy accountant against dp_accounting called directly, and the task-level checks."""

from __future__ import annotations

import math

import dp_accounting
import pytest

from paxlike import registry
from paxlike.config import config_io
from paxlike.trainer import privacy
from paxlike.errors import UserError


def _direct_epsilon(event, rounds, delta, ledger):
  return ledger.compose(dp_accounting.SelfComposedDpEvent(event, rounds)).get_epsilon(delta)


@pytest.mark.parametrize('accountant', ['rdp', 'pld'])
def test_poisson_epsilon_is_dp_accountings_and_grows_with_rounds(accountant):
  q, z, delta = 0.05, 1.1, 1e-5
  event = privacy.round_event(z, 'poisson', clients_per_round=5, population=100)
  direct = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
  make = {'rdp': dp_accounting.rdp.RdpAccountant, 'pld': dp_accounting.pld.PLDAccountant}
  eps = [privacy.epsilon(event, t, delta, accountant) for t in (10, 50, 200)]
  assert eps == [_direct_epsilon(direct, t, delta, make[accountant]()) for t in (10, 50, 200)]
  assert 0 < eps[0] < eps[1] < eps[2]


def test_fixed_size_cohorts_use_replace_one_with_twice_the_sensitivity():
  z, delta = 2.0, 1e-5
  event = privacy.round_event(z, 'without_replacement', clients_per_round=20, population=100)
  ledger = dp_accounting.rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  direct = dp_accounting.SampledWithoutReplacementDpEvent(
      100, 20, dp_accounting.GaussianDpEvent(z / 2))  # Replacing a client moves the sum ≤ 2C.
  assert privacy.epsilon(event, 30, delta) == _direct_epsilon(direct, 30, delta, ledger)
  assert privacy.epsilon(event, 30, delta) < privacy.epsilon(event, 31, delta)
  with pytest.raises(UserError, match="use accountant='rdp'"):
    privacy.epsilon(event, 30, delta, 'pld')


def test_full_participation_is_the_plain_gaussian_mechanism():
  z, rounds, delta = 5.0, 100, 1e-5
  event = privacy.round_event(z, 'full', clients_per_round=8, population=8)
  # Composed Gaussians are one Gaussian with z/√T; its exact (ε, δ) curve (Balle & Wang 2018).
  exact = dp_accounting.pld.PLDAccountant().compose(
      dp_accounting.GaussianDpEvent(z / math.sqrt(rounds))).get_epsilon(delta)
  assert privacy.epsilon(event, rounds, delta, 'pld') == pytest.approx(exact, rel=1e-3)
  assert privacy.epsilon(event, 0, delta) == 0.0


def _task(exp: str, *overrides: str):
  registry.import_all()
  cfg = registry.get(exp)().config()
  config_io.apply_overrides(cfg, list(overrides))
  return config_io.build(cfg)


def test_task_accountant_reads_the_cohort_from_the_data():
  task = _task('federated.DigitsDpFedAvg', 'train.num_steps=30')
  acc = privacy.checked_accountant(task)
  data, aggregator = task.data, task.algorithm.keywords['aggregator']
  # The population is the clients the source has; here as many as data.num_clients asked for.
  assert (acc.sampling, acc.clients_per_round, acc.population) == (
      'without_replacement', data.clients_per_round, len(data.client_sizes))
  assert acc.population == data.num_clients
  assert acc.delta == aggregator.delta == 1e-5
  assert 1 <= acc.epsilon(task.train.num_steps) <= 10
  assert privacy.round_metrics(acc, 7) == {'dp_epsilon': acc.epsilon(7), 'dp_delta': 1e-5}
  assert privacy.round_metrics(None, 7) == {}
  assert f'after {task.train.num_steps} rounds' in acc.describe(task.train.num_steps)


def test_default_delta_and_budget_refusal():
  task = _task('federated.DigitsDpFedAvg', 'algorithm.aggregator.delta=None',
               'algorithm.aggregator.max_epsilon=0.5')
  with pytest.raises(UserError, match='max_epsilon'):
    privacy.checked_accountant(task)
  acc = privacy.accountant(task)
  assert acc.delta == task.data.num_clients**-1.1
  noiseless = privacy.accountant(_task('federated.DigitsDpFedAvg',
                                       'algorithm.aggregator.noise_multiplier=0.0'))
  assert (noiseless.epsilon(0), noiseless.epsilon(1)) == (0.0, math.inf)
  weighted = _task('federated.DigitsDpFedAvg', 'data.sampling="weighted"')
  with pytest.raises(UserError, match='uniform, Poisson or fixed cohorts'):
    privacy.accountant(weighted)
