"""The fedopt reproduction (scripts/reproductions/fedopt.py): its verdict decides Reddi et
al.'s claim right on made-up numbers (the paper's own, and ones breaking each condition), a
run's score is the mean of its last evals, and its experiments change nothing but the server
optimizer of federated.DigitsFedAvg. Its --quick run is tests/test_reproduce.py's."""

from __future__ import annotations

import sys

import fiddle as fdl
import pytest

from tests.helpers import REPO

sys.path.insert(0, str(REPO / 'scripts'))

from reproductions import fedopt  # noqa: E402

PAPER = {'fedavg': 0.728, 'fedadam': 0.774, 'fedyogi': 0.780}  # Table 2, CIFAR-10.
FLAT = {'fedadam': {1e-4: 0.770, 1e-3: 0.774, 1e-2: 0.762},
        'fedyogi': {1e-4: 0.776, 1e-3: 0.780, 1e-2: 0.771}}


def test_the_papers_numbers_reproduce():
  assert fedopt.verdict(PAPER, FLAT) == ('reproduced', [])


@pytest.mark.parametrize('accuracy, by_tau, result, failed', [
    ({**PAPER, 'fedadam': 0.735}, FLAT, 'partly', ['FedAdam beats FedAvg']),  # +0.7 points.
    ({**PAPER, 'fedyogi': 0.70}, FLAT, 'partly', ['FedYogi beats FedAvg']),
    ({**PAPER, 'fedavg': 0.79}, FLAT, 'not', ['FedAdam beats', 'FedYogi beats']),
    (PAPER, {**FLAT, 'fedyogi': {1e-4: 0.78, 1e-3: 0.78, 1e-2: 0.75}}, 'partly',
     ['FedYogi is flat']),  # 3 points apart.
    (PAPER, {**FLAT, 'fedadam': {1e-4: 0.74, 1e-3: 0.774}}, 'partly', ['FedAdam is flat']),
])
def test_each_broken_condition_is_named(accuracy, by_tau, result, failed):
  got, reasons = fedopt.verdict(accuracy, by_tau)
  assert got == result and len(reasons) == len(failed)
  assert all(f in r for f, r in zip(failed, reasons))


def test_tau_outside_the_claimed_range_and_single_taus_are_not_judged():
  wide = {m: {**by, 1e-1: 0.3, 1e-6: 0.5} for m, by in FLAT.items()}  # Outside [1e-4, 1e-2].
  assert fedopt.verdict(PAPER, wide) == ('reproduced', [])
  # One τ: no flatness check at all (a --quick run), only the comparison with FedAvg.
  assert fedopt.verdict(PAPER, {m: {1e-3: 0.1} for m in FLAT}) == ('reproduced', [])
  assert fedopt.verdict({**PAPER, 'fedavg': 0.9}, {})[0] == 'not'


def test_a_runs_score_is_the_mean_of_its_last_evals():
  rows = [{'step': 10, 'eval_accuracy': 0.5}, {'step': 15, 'loss': 1.0},
          {'step': 20, 'eval_accuracy': 0.7}, {'step': 30, 'eval_accuracy': 0.6}]
  assert fedopt.final_accuracy(rows, 2) == pytest.approx((0.7 + 0.6) / 2)
  assert fedopt.final_accuracy(rows, 10) == pytest.approx((0.5 + 0.7 + 0.6) / 3)


def test_overrides_set_each_methods_own_server_rate():
  plan = fedopt.FULL
  avg = fedopt._overrides(plan, 'fedavg', 0.1, 1.0, 0, 1e-3)
  assert avg['algorithm.server_optimizer.learning_rate'] == 1.0 and 'algorithm.tau' not in avg
  yogi = fedopt._overrides(plan, 'fedyogi', 0.03, 0.01, 1, 1e-4)
  assert (yogi['algorithm.server_learning_rate'], yogi['algorithm.tau']) == (0.01, 1e-4)
  assert yogi['data.partition'] == 'dirichlet' and yogi['data.alpha'] == 0.1
  assert yogi['optimizer.learning_rate'] == 0.03 and yogi['train.seed'] == 1
  # One local epoch: local steps × batch = a client's 600 of Fashion-MNIST's 60,000 images.
  assert plan['local_steps'] * plan['batch'] * plan['clients'] == 60_000


@pytest.mark.parametrize('name, fn', [('DigitsFedAdam', 'fed_adam'),
                                      ('DigitsFedYogi', 'fed_yogi')])
def test_the_experiments_change_only_the_server_optimizer(name, fn):
  import paxlike.experiments.federated  # noqa: F401  (registers DigitsFedAvg)
  from paxlike import federated, registry
  from paxlike.config import config_io
  ours = registry.get(f'{fedopt.MODULE}.{name}')().config()
  base = registry.get('federated.DigitsFedAvg')().config()
  assert fdl.get_callable(ours.algorithm) is getattr(federated, fn)
  assert ours.algorithm.flavour == 'paper'  # Algorithm 2, not optax's bias-corrected one.
  differ = {line.split(':')[0].split('.')[0] for line in config_io.differences(base, ours)}
  assert differ == {'algorithm'}
  # The CLI takes the reproduction's overrides on this config.
  config_io.apply_overrides(ours, [f'{k}={v}' for k, v in fedopt._overrides(
      fedopt.FULL, 'fedadam', 0.03, 0.01, 0, 1e-2).items()])
  assert (ours.algorithm.server_learning_rate, ours.algorithm.tau) == (0.01, 1e-2)
