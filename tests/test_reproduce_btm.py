"""The btm reproduction's parts: its verdict on made-up numbers (the paper's shape, and ones that
break each condition), the runs' overrides, the page's diagnostics, the per-domain scoring's
pure helpers against direct computations, and (slow) the scoring of a trained job against the
trainer's own per-domain eval of the same experts."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from tests.helpers import REPO, assert_verdict, cli_env, run_python

sys.path.insert(0, str(REPO / 'scripts'))

from reproductions import btm, btm_eval, btm_why, trainer  # noqa: E402

DENSE = [3.00, 3.10, 3.20, 3.30]  # Made-up per-domain losses (nats per byte).
PAPER = dict(ensemble=[2.90, 3.00, 3.05, 3.20], random=[3.05, 3.12, 3.20, 3.35],
             uniform=[3.40, 3.50, 3.60, 3.70], weighted=[3.00, 3.10, 3.15, 3.30])


def shifted(values, by):
  return [v + by for v in values]


@pytest.mark.parametrize('change, result, failed', [
    ({}, 'reproduced', None),                                    # The paper's shape.
    ({'random': shifted(DENSE, -0.005)}, 'reproduced', None),    # Random: within MIN_NATS.
    ({'random': shifted(DENSE, -0.02)}, 'partly', 'random-split'),
    ({'ensemble': [2.5, 2.6, 2.7, 3.31]}, 'partly', 'every domain'),  # Worse on one domain.
    ({'ensemble': shifted(DENSE, -0.005)}, 'partly', 'on average'),
    ({'weighted': PAPER['uniform']}, 'partly', 'posterior-weighted'),
    ({'ensemble': DENSE}, 'not', 'beats the dense model'),
    ({'ensemble': shifted(DENSE, 0.1)}, 'not', 'beats the dense model'),
])
def test_verdict_follows_the_papers_claim(change, result, failed):
  numbers = {**PAPER, **change}
  assert_verdict(btm.verdict(DENSE, numbers['ensemble'], numbers['random'], numbers['uniform'],
                             numbers['weighted']), result, failed)


def test_dense_is_all_seed_rounds_and_random_splits_documents():
  plan = btm.FULL
  dense = btm._overrides(plan, 'dense', 0)
  domains = btm._overrides(plan, 'domains', 0)
  random = btm._overrides(plan, 'random', 1)
  assert dense['algorithm.seed_steps'] == dense['train.num_steps'] == plan['rounds']
  assert domains['algorithm.seed_steps'] == plan['seed_rounds'] < plan['rounds']
  assert 'data.partition' not in domains  # ShakespeareBtm's own: the 4 domains.
  assert random['data.partition'] == 'iid' and random['train.seed'] == 1
  assert all(o['data.num_eval_batches'] is None for o in (dense, domains, random))


def test_long_runs_scale_rounds_and_the_seed_together():
  plan = btm.FULL
  dense, domains = (btm._overrides(plan, k, 0) for k in btm.LONG)
  assert dense['train.num_steps'] == dense['algorithm.seed_steps'] == 2 * plan['rounds']
  assert domains['train.num_steps'] == 2 * plan['rounds']
  assert domains['algorithm.seed_steps'] == 2 * plan['seed_rounds']
  assert btm.QUICK['long'] is None  # The quick run trains no diagnostic.


def test_equal_tokens_round_matches_bytes_per_model():
  plan = btm.FULL
  at = btm_why.equal_tokens_round(plan)
  per_round = plan['local_steps'] * plan['batch'] * plan['seq_len']  # One slot's bytes.
  expert = (plan['seed_rounds'] * btm.DOMAINS + plan['rounds'] - plan['seed_rounds']) * per_round
  assert at * btm.DOMAINS * per_round == expert
  assert at % plan['eval_every'] == 0  # The dense run has an eval there.


def test_loss_at_and_same_seed_read_the_rows():
  rows = [{'step': 25, 'loss': 2.0, 'eval_loss': 1.9}, {'step': 50, 'loss': 1.8},
          {'step': 75, 'loss': 1.7, 'eval_loss': 1.6}]
  assert btm_why.loss_at(rows, 'eval_loss', 75) == 1.6
  assert btm_why.loss_at(rows, 'eval_loss', 50) is None
  other = [dict(r) for r in rows]
  assert btm_why.same_seed(rows, other, 50)
  other[2]['loss'] = 9.0  # After the branch: may differ.
  assert btm_why.same_seed(rows, other, 50) and not btm_why.same_seed(rows, other, 75)


def test_specialization_is_the_own_experts_margin():
  experts = np.array([[1.0, 2.0, 3.0], [2.0, 1.5, 3.0], [4.0, 2.5, 2.0]])
  # Domain 0: others (2 + 4) / 2 - 1 = 2; domain 1: (2 + 2.5) / 2 - 1.5 = 0.75; domain 2: 1.
  assert btm_why.specialization(experts) == pytest.approx((2 + 0.75 + 1) / 3)


def test_posterior_weights_average_each_windows_bayes_posterior():
  rng = np.random.default_rng(0)
  lp = -rng.random((3, 6, 4))  # [experts, windows, targets]
  group = np.array([[0] * 4, [1] * 4, [0, 0, 0, 1], [1, 1, 0, 0], [0] * 4, [2] * 4])
  prior = np.array([0.5, 0.25, 0.25])
  w = btm_eval.posterior_weights(lp, group, prior, 0, windows=10)
  mine = [0, 2, 4]  # Windows whose targets are mostly domain 0's.
  post = [prior * np.exp(lp[:, i].sum(axis=1)) for i in mine]
  expected = np.mean([p / p.sum() for p in post], axis=0)
  np.testing.assert_allclose(w, expected, rtol=1e-9)
  np.testing.assert_allclose(btm_eval.posterior_weights(lp, group, prior, 3), prior)


def test_domain_mean_and_chunked():
  values = np.array([[-1.0, -2.0], [-3.0, -4.0]])
  group = np.array([[0, 1], [1, -1]])
  np.testing.assert_allclose(btm_eval.domain_mean(values, group, 2), [1.0, 2.5])
  inputs = np.arange(2 * 150).reshape(150, 2)
  out = btm_eval.chunked(lambda x, y: x.sum(axis=1) + 0 * y[:, 0], inputs, inputs)
  np.testing.assert_array_equal(out, inputs.sum(axis=1))
  stacked = btm_eval.chunked(lambda x, y: np.stack([x[:, 0], y[:, 1]]), inputs, inputs, axis=1)
  np.testing.assert_array_equal(stacked, inputs.T)


@pytest.mark.slow
def test_scoring_a_trained_job_is_the_trainers_per_domain_eval(tmp_path):
  """The scoring of the checkpoint's experts equals the trainer's own per-domain eval of their
  ensemble, and its uniform average is close to the trainer's size-weighted merge."""
  plan = btm.QUICK
  job = tmp_path / 'domains'
  command = trainer.command(btm.EXP, job, btm._overrides(plan, 'domains', 0))
  proc = run_python(command[1:], cli_env(1), timeout=600)  # Forked: no interpreter start-up.
  assert proc.returncode == 0, proc.stderr[-2000:]
  scores = btm_eval.score(job)
  table = btm.domain_table(job)
  names = scores['domains']
  assert sorted(names) == sorted(table) and len(names) == btm.DOMAINS
  np.testing.assert_allclose(scores['ensemble'], [table[n]['ensemble_loss'] for n in names],
                             atol=1e-4)
  np.testing.assert_allclose(scores['uniform'], [table[n]['loss'] for n in names], atol=2e-2)
  assert scores['experts'].shape == (4, 4) and scores['weights'].shape == (4, 4)
  np.testing.assert_allclose(scores['weights'].sum(axis=1), 1.0, rtol=1e-9)
  assert json.loads((job / 'metrics.jsonl').read_text().splitlines()[-1])['step'] == 2
