"""The dpo reproduction's pure parts: its verdict on made-up numbers (what the paper's analysis
predicts, and numbers that break each condition), the log-ratios it reads from a run's and the
probe's held-out log-probabilities, the runs it trains, and its key numbers from made-up rows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, assert_verdict

sys.path.insert(0, str(REPO / 'scripts'))

from reproductions import dpo, dpo_page  # noqa: E402


@pytest.mark.parametrize('accuracy, margins, chosen, rejected, result, failed', [
    (0.93, (1.3, 3.5), -5.4 / 0.1 / 10, -8.9 / 0.1 / 10, 'reproduced', None),  # DpoTiny's run.
    (0.75, (0.5, 0.6), 0.2, -0.4, 'reproduced', None),  # The chosen may rise, if less.
    (0.74, (0.5, 0.6), 0.2, -0.4, 'partly', 'at least 0.75'),
    (0.9, (0.6, 0.6), -0.1, -0.7, 'partly', 'margin grows'),
    (0.9, (0.5, 2.0), -2.0, -1.5, 'partly', 'moves further'),
    (0.6, (0.5, 2.0), -0.5, -2.5, 'not', 'above 0.6'),
    (0.9, (0.5, -0.1), -0.5, -0.4, 'not', 'positive margin'),
])
def test_verdict_follows_the_analysis(accuracy, margins, chosen, rejected, result, failed):
  assert_verdict(dpo.verdict(accuracy, margins, chosen, rejected), result, failed)


def test_broken_conditions_are_all_named():
  got, reasons = dpo.verdict(0.7, (1.0, 0.9), 0.5, -0.2)
  assert got == 'partly' and len(reasons) == 3
  got, reasons = dpo.verdict(0.9, (0.5, 2.0), 3.0, 1.0)  # Both rose: the rejected less.
  assert got == 'partly' and len(reasons) == 2 and 'falls below' in reasons[0]


def test_log_ratios_subtract_the_references_log_probabilities():
  rows = [{'step': 5, 'loss': 0.6}, {'step': 10, 'eval_rewards/accuracies': 0.6,
                                     'eval_logps/chosen': -30.0, 'eval_logps/rejected': -41.0}]
  reference = {'eval_logps/chosen': -28.5, 'eval_logps/rejected': -38.0}
  assert dpo.log_ratios(rows, reference) == [(10, -1.5, -3.0)]


def test_runs_tune_from_the_sft_job_and_the_probe_does_not_move():
  plan = dpo.FULL
  runs = {name: (exp, overrides) for name, exp, overrides in dpo.runs(plan, Path('/w'))}
  assert list(runs) == ['base', 'probe', *dpo.METHODS]
  assert runs['base'] == (dpo.BASE, {'train.num_steps': plan['base_steps'],
                                     'train.eval_every': plan['base_steps'],
                                     'train.log_every': plan['base_steps'],
                                     'train.checkpoint_every': plan['base_steps']})
  exp, probe = runs['probe']
  assert exp == dpo.TUNE and probe['train.init_from'] == 'job:/w/base'
  assert probe['optimizer.learning_rate.peak_value'] == 0.0 and probe['train.num_steps'] == 1
  for name, method in dpo.METHODS.items():
    _, overrides = runs[name]
    assert overrides['loss.kind'] == method['kind'] and overrides['train.init_from'] == 'job:/w/base'
    assert ('model.lora_rank' in overrides) == (not method['lora'])
    assert overrides['train.num_steps'] == plan['steps']
  assert runs['simpo'][1]['loss.gamma'] == 1.0 and runs['dpo_full'][1]['model.lora_rank'] == 0


def test_a_quick_plan_shrinks_every_run_alike():
  """Tuning from the base job needs the base's shapes: the quick plan's one layer is in every
  run's overrides, the full plan's runs keep the experiments' model."""
  assert {o.get('model.num_layers') for _, _, o in dpo.runs(dpo.QUICK, Path('/w'))} == {1}
  assert all('model.num_layers' not in o for _, _, o in dpo.runs(dpo.FULL, Path('/w')))


def _rows(accuracy, chosen, rejected, beta=0.1, reference=(-20.0, -25.0)):
  """Eval rows at steps 10, 20 whose log-ratios are `chosen` and `rejected` (pairs of values)."""
  return [{'step': 10 * (i + 1), 'eval_rewards/accuracies': a, 'eval_loss': 0.5,
           'eval_logps/chosen': reference[0] + c, 'eval_logps/rejected': reference[1] + r,
           'eval_rewards/chosen': beta * c, 'eval_rewards/rejected': beta * r}
          for i, (a, c, r) in enumerate(zip(accuracy, chosen, rejected))]


def test_numbers_and_report_from_made_up_runs():
  probe = [{'step': 1, 'eval_rewards/accuracies': 0.7, 'eval_logps/chosen': -20.0,
            'eval_logps/rejected': -25.0, 'eval_loss': 0.1}]
  rows = {'probe': probe, **{name: _rows((0.7, 0.9), (-0.5, -1.0), (-2.0, -4.0))
                             for name in dpo.METHODS}}
  rows['dpo'][1]['eval_rewards/chosen'] += 0.01  # A reward off by 0.1 nats of log-ratio.
  numbers = dpo_page._numbers(dpo.FULL, rows)  # pylint: disable=protected-access
  assert numbers['dpo_accuracy'] == 0.9 and numbers['sft_likelihood_accuracy'] == 0.7
  assert numbers['dpo_margins'] == pytest.approx((1.5, 3.0))
  assert (numbers['dpo_chosen'], numbers['dpo_rejected']) == pytest.approx((-1.0, -4.0))
  assert numbers['dpo_reward_vs_logps_gap'] == pytest.approx(0.1)
  report = dpo_page.report(False, dpo.FULL, rows)
  assert report.verdict == 'reproduced' and 'lost likelihood too' in report.why
