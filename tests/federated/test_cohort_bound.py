"""The DP aggregator's divisor under Poisson sampling (the expected cohort qN) is a value given
where the run's algorithm is built (privacy.cohort_bound, called by build.setup): the
accountant is a query that changes nothing, and the configured aggregator is never mutated."""

from __future__ import annotations

import pytest

from paxlike import registry
from paxlike.config import config_io
from paxlike.errors import UserError
from paxlike.trainer import privacy
from paxlike.trainer import build

K = 100  # DigitsDpFedAvg's data.clients_per_round: the expected Poisson cohort.


def _task(*overrides: str):
  registry.import_all()
  cfg = registry.get('federated.DigitsDpFedAvg')().config()
  config_io.apply_overrides(cfg, list(overrides))
  return config_io.build(cfg)


def test_the_compiled_round_divides_by_the_expected_cohort_and_nothing_is_mutated():
  task = _task('data.sampling="poisson"')
  configured = privacy.aggregator_of(task.built_algorithm)
  privacy.checked_accountant(task)
  assert configured.expected_clients is None  # The accountant set nothing.
  trainer = build.setup(task, train_step=False, evaluator=False)
  assert privacy.aggregator_of(trainer.program.algorithm).expected_clients == K
  assert privacy.aggregator_of(trainer.task.built_algorithm).expected_clients == K
  assert configured.expected_clients is None and task.built_algorithm.aggregator is configured
  bound = privacy.aggregator_of(privacy.cohort_bound(task).built_algorithm)
  assert bound == privacy.aggregator_of(trainer.task.built_algorithm)


def test_without_poisson_sampling_the_task_is_its_own_and_the_slots_divide():
  task = _task()  # data.sampling='uniform'.
  assert privacy.cohort_bound(task) is task
  assert privacy.aggregator_of(task.built_algorithm).divisor(7) == 7


def test_a_configured_divisor_is_kept_when_it_is_the_cohorts_and_refused_when_not():
  same = _task('data.sampling="poisson"', f'algorithm.aggregator.expected_clients={K}.0')
  assert privacy.cohort_bound(same) is same
  other = _task('data.sampling="poisson"', 'algorithm.aggregator.expected_clients=50.0')
  for query in (privacy.cohort_bound, privacy.accountant):
    with pytest.raises(UserError, match='expected_clients=50 but a Poisson cohort expects '
                                        f'data.clients_per_round={K}: leave it unset'):
      query(other)
