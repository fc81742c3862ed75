"""The papa reproduction's pure parts: its verdict on made-up numbers (the paper's gains, and
ones that break each condition), how a run's accuracy and the methods' means are read, the runs
it trains and their overrides, and the noise its page reports."""

from __future__ import annotations

import sys

import pytest

from tests.helpers import REPO, assert_verdict

sys.path.insert(0, str(REPO / 'scripts'))

from reproductions import papa, papa_why  # noqa: E402

ALONE = 75.0  # A made-up CIFAR-100-like baseline; the paper's gains are added to it.


@pytest.mark.parametrize('soups, gains, result, failed', [
    ((1.0, 75.5), (1.9, 1.5, 1.6), 'reproduced', None),    # The paper's CIFAR-100 gain.
    ((1.0,), (0.8, 0.6, 0.7), 'reproduced', None),          # Its CIFAR-10 gain.
    ((1.0, 75.5), (0.4, 0.3, 0.3), 'reproduced', None),     # The smallest gain that counts.
    ((1.0, 75.5), (0.3, 0.3, 0.3), 'partly', 'at least 0.4 points'),
    ((1.0, 76.1), (0.9, 0.5, 0.5), 'reproduced', None),     # A soup within TIE of PAPA.
    ((1.0, 76.5), (0.9, 0.5, 0.5), 'partly', 'uniform soup'),
    ((77.0,), (0.9, 0.5, 0.5), 'partly', 'uniform soup'),
    ((1.0,), (0.9, -0.1, 0.5), 'partly', 'PAPA-all beats'),
    ((1.0,), (0.9, 0.5, 0.0), 'partly', 'PAPA-2 beats'),
    ((1.0,), (0.0, 0.5, 0.5), 'not', 'beats the mean'),
    ((1.0,), (-1.0, 0.5, 0.5), 'not', 'beats the mean'),
])
def test_verdict_follows_the_papers_claim(soups, gains, result, failed):
  assert_verdict(papa.verdict(ALONE, soups, *(ALONE + g for g in gains)), result, failed)


def test_every_broken_condition_is_named():
  got, reasons = papa.verdict(ALONE, [80.0], ALONE + 0.1, ALONE - 1, ALONE - 1)
  assert got == 'partly' and len(reasons) == 4


def test_final_accuracy_is_the_last_eval_in_points():
  rows = [{'step': 50, 'eval_accuracy': 0.5}, {'step': 60}, {'step': 100, 'eval_accuracy': 0.875}]
  assert papa.final_accuracy(rows) == pytest.approx(87.5)
  with pytest.raises(ValueError, match='no eval'):
    papa.final_accuracy([{'step': 1}])


def test_runs_train_each_member_alone_and_each_population_once_per_seed():
  plan = papa.FULL
  runs = papa.runs(plan)
  per_seed = plan['alone'] + len(papa.METHODS) - 1
  assert len(runs) == len(plan['seeds']) * per_seed
  assert len({name for name, *_ in runs}) == len(runs)
  alone_seeds = [seed for _, method, _, seed in runs if method == 'alone']
  assert sorted(alone_seeds) == list(range(len(plan['seeds']) * plan['population']))
  quick = papa.runs(papa.QUICK)
  assert [m for _, m, _, _ in quick] == ['alone', 'soup', 'papa', 'papa_all', 'papa_2']


@pytest.mark.parametrize('method, expected', [
    ('alone', {'algorithm.population': 1, 'data.clients_per_round': 1}),
    ('soup', {'algorithm.alpha': 1.0, 'algorithm.population': 4}),
    ('soup_same', {'algorithm.alpha': 1.0, 'algorithm.same_init': True}),
    ('papa', {'algorithm.alpha': 0.99, 'algorithm.every': 1}),
    ('papa_all', {'algorithm.variant': 'all', 'algorithm.every': 100}),
    ('papa_2', {'algorithm.variant': 'pairs', 'algorithm.every': 100}),
])
def test_overrides_set_each_methods_algorithm(method, expected):
  fields = papa._overrides(papa.FULL, method, 3)
  assert {k: fields[k] for k in expected} == expected
  assert fields['train.seed'] == 3 and fields['data.partition'] == 'iid'
  assert fields['data.clients_per_round'] == fields['algorithm.population']
  if method != 'soup_same':
    assert 'algorithm.same_init' not in fields


def test_means_average_members_and_seeds():
  plan = {**papa.FULL, 'seeds': (0, 1)}
  acc = lambda *a: [{'accuracy': x} for x in a]
  results = {('alone', 0): acc(80, 82), ('alone', 1): acc(84, 86)}
  results.update({(m, g): acc(90 + g) for m in papa.METHODS[1:] for g in (0, 1)})
  m = papa.means(plan, results)
  assert m['alone'] == pytest.approx(83.0) and m['papa'] == pytest.approx(90.5)
  assert papa_why.seed_gains(plan, results, 'papa') == pytest.approx([9.0, 6.0])


def test_swing_is_the_mean_move_between_evals_in_the_second_half():
  rows = [{'eval_accuracy': a} for a in (0.1, 0.9, 0.5, 0.7, 0.3)]
  results = {('papa', 0): [{'rows': rows}], ('papa', 1): [{'rows': rows[:3]}]}
  # Second halves: (0.5, 0.7, 0.3) moves 20 and 40 points; (0.9, 0.5) moves 40.
  assert papa_why.swing(results, 'papa', (0, 1)) == pytest.approx((30 + 40) / 2)
