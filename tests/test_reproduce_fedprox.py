"""The fedprox reproduction's pure parts: its verdict on made-up numbers (the paper's, and ones
that break each condition), how a run's accuracy and the best setting are read, the runs it
trains, and the straggler counts its page reports, against the data's own draws."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tests.helpers import REPO, assert_verdict

sys.path.insert(0, str(REPO / 'scripts'))

from reproductions import fedprox, fedprox_why  # noqa: E402

from paxlike.data import sources  # noqa: E402


@pytest.mark.parametrize('non_iid, iid, result, failed', [
    (22.0, 0.5, 'reproduced', None),       # The paper's average gain; alike on IID data.
    (22.0, -2.9, 'reproduced', None),
    (5.0, 0.0, 'reproduced', None),        # The smallest gain that counts.
    (4.9, 0.0, 'partly', 'at least 5 points'),
    (22.0, 3.5, 'partly', 'within 3 points'),
    (22.0, -8.0, 'partly', 'within 3 points'),
    (0.0, 0.0, 'not', 'beats FedAvg'),
    (-10.0, 1.0, 'not', 'beats FedAvg'),
])
def test_verdict_follows_the_papers_claim(non_iid, iid, result, failed):
  assert_verdict(fedprox.verdict(non_iid, iid), result, failed)


def test_two_broken_conditions_are_both_named():
  got, reasons = fedprox.verdict(2.0, 6.0)
  assert got == 'partly' and len(reasons) == 2


def test_final_accuracy_is_the_mean_of_the_last_evals():
  rows = [{'step': 10, 'eval_accuracy': 0.2}, {'step': 15}, {'step': 20, 'eval_accuracy': 0.6},
          {'step': 30, 'eval_accuracy': 0.4}]
  assert fedprox.final_accuracy(rows, 2) == pytest.approx(0.5)
  assert fedprox.final_accuracy(rows, 10) == pytest.approx(0.4)
  with pytest.raises(ValueError, match='no eval'):
    fedprox.final_accuracy([{'step': 1}], 2)


def test_best_setting_is_the_best_mean_over_seeds_ties_to_the_smaller():
  key, mean = fedprox.best({0.01: [0.7, 0.8], 1.0: [0.9, 0.8], 0.1: [0.6, 0.6]})
  assert key == 1.0 and mean == pytest.approx(0.85)
  assert fedprox.best({0.1: [0.5], 0.001: [0.5]})[0] == 0.001


def test_summary_takes_fedavgs_best_rate_and_fedproxs_best_mu():
  plan = {**fedprox.FULL, 'fedavg_lrs': (0.01, 0.05), 'mus': (0.1, 1.0), 'mu0': True}
  acc = lambda *a: [{'accuracy': x} for x in a]
  results = {('shards', 'fedavg', 0.01): acc(0.50, 0.60),
             ('shards', 'fedavg', 0.05): acc(0.40, 0.50),
             ('shards', 'fedprox', 0.0): acc(0.70, 0.72),
             ('shards', 'fedprox', 0.1): acc(0.80, 0.80),
             ('shards', 'fedprox', 1.0): acc(0.78, 0.80)}
  s = fedprox.summary(plan, results, 'shards')
  assert (s['fedavg_lr'], s['mu']) == (0.01, 0.1)
  assert s['gain'] == pytest.approx(25.0) and s['gain_mu0'] == pytest.approx(16.0)


def test_runs_drop_stragglers_for_fedavg_and_keep_them_for_fedprox():
  plan = fedprox.FULL
  runs = fedprox.runs(plan)
  per = len(plan['fedavg_lrs']) + 1 + len(plan['mus'])
  drift = len(plan['seeds']) * len(plan['drift']['mus'])
  assert len(runs) == len(fedprox.PARTITIONS) * len(plan['seeds']) * per + drift
  assert len({name for name, *_ in runs}) == len(runs)
  by_key = {(key, seed): overrides for _, key, seed, overrides in runs}
  fedavg = by_key[(('shards', 'fedavg', 0.01), 1)]
  assert 'algorithm.prox_mu' not in fedavg and fedavg['data.straggler_fraction'] == 0.9
  assert fedavg['optimizer.learning_rate'] == 0.01 and fedavg['train.seed'] == 1
  prox = by_key[(('iid', 'fedprox', 0.0), 0)]
  assert prox['algorithm.drop_stragglers'] is False and prox['algorithm.prox_mu'] == 0.0
  assert prox['data.partition'] == 'iid' and prox['data.local_steps'] == plan['local_steps']
  more = by_key[(('shards', 'drift', 1.0), 0)]
  assert more['data.local_steps'] == 100 and more['optimizer.learning_rate'] == 0.2
  assert len(fedprox.runs(fedprox.QUICK)) == 4  # The quick run: 2 per partition.


def test_kept_counts_are_the_clients_that_ran_every_step():
  plan = {**fedprox.QUICK, 'cohort': 10, 'rounds': 300, 'seeds': (0, 3), 'local_steps': 6}
  kept = fedprox_why.kept_counts(plan)
  assert kept.shape == (2, 300)
  steps = sources.straggler_steps(3, 17, np.ones(10, bool), 6, 0.9)
  assert kept[1, 16] == np.sum(steps == 6)
  # Binomial(10, 0.1): P(0 kept) = 0.9**10 = 0.349.
  assert abs(np.mean(kept == 0) - 0.9**10) < 5 * np.sqrt(0.349 * 0.651 / 600)


def test_swing_is_the_mean_move_between_evals_in_the_second_half():
  rows = [{'eval_accuracy': a} for a in (0.1, 0.9, 0.5, 0.7, 0.3)]
  results = {'k': [{'rows': rows}, {'rows': rows[:1] + rows[1:]}]}
  assert fedprox_why.swing(results, 'k') == pytest.approx(100 * (0.2 + 0.4) / 2)
