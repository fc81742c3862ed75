"""The preference losses on given log-probabilities against float64 numpy computations of the
published formulas: DPO (Rafailov et al. 2023, eq. 7), conservative DPO (Mitchell 2023), IPO
(Azar et al. 2023, eq. 17; per-token as TRL, and summed), SimPO (Meng et al. 2024, eq. 6) and
ORPO (Hong et al. 2024, eqs. 4-7); the rewards, the tie convention, beta -> 0 and bad settings."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.errors import UserError
from paxlike.trainer.preference_loss import PairLogps, PreferenceLoss, pair_losses, pair_metrics

RNG = np.random.default_rng(0)
CHOSEN = -RNG.uniform(5, 40, 6)
REJECTED = -RNG.uniform(5, 40, 6)
REF_CHOSEN = CHOSEN + RNG.normal(0, 2, 6)
REF_REJECTED = REJECTED + RNG.normal(0, 2, 6)
CHOSEN_TOKENS = RNG.integers(3, 30, 6).astype(np.float64)
REJECTED_TOKENS = RNG.integers(3, 30, 6).astype(np.float64)


def log_sigmoid(x):
  return -np.log1p(np.exp(-x))


def logps(with_reference: bool = True) -> PairLogps:
  f = lambda x: jnp.asarray(x, jnp.float32)
  refs = (f(REF_CHOSEN), f(REF_REJECTED)) if with_reference else (None, None)
  return PairLogps(f(CHOSEN), f(REJECTED), f(CHOSEN_TOKENS), f(REJECTED_TOKENS), *refs)


def losses_of(**settings) -> np.ndarray:
  loss = PreferenceLoss(**settings)
  value, _, _ = pair_losses(loss, logps(loss.needs_reference))
  return np.asarray(value, np.float64)


def test_dpo_is_minus_log_sigmoid_of_beta_times_the_log_ratio_difference():
  beta = 0.3
  delta = (CHOSEN - REF_CHOSEN) - (REJECTED - REF_REJECTED)
  np.testing.assert_allclose(losses_of(kind='dpo', beta=beta), -log_sigmoid(beta * delta),
                             rtol=1e-5)


def test_conservative_dpo_mixes_both_labels_by_epsilon():
  beta, eps = 0.2, 0.1
  delta = (CHOSEN - REF_CHOSEN) - (REJECTED - REF_REJECTED)
  want = -(1 - eps) * log_sigmoid(beta * delta) - eps * log_sigmoid(-beta * delta)
  np.testing.assert_allclose(losses_of(kind='dpo', beta=beta, label_smoothing=eps), want,
                             rtol=1e-5)


@pytest.mark.parametrize('average', [True, False])
def test_ipo_is_the_squared_distance_of_the_log_ratio_gap_to_half_over_beta(average):
  beta = 0.5
  h_w, h_l = CHOSEN - REF_CHOSEN, REJECTED - REF_REJECTED
  if average:  # TRL's form: each log-ratio per completion token.
    h_w, h_l = h_w / CHOSEN_TOKENS, h_l / REJECTED_TOKENS
  want = (h_w - h_l - 1 / (2 * beta)) ** 2
  np.testing.assert_allclose(losses_of(kind='ipo', beta=beta, ipo_average=average), want,
                             rtol=1e-5)


def test_simpo_is_reference_free_length_normalised_with_a_margin():
  beta, gamma = 2.0, 0.7
  a_w, a_l = CHOSEN / CHOSEN_TOKENS, REJECTED / REJECTED_TOKENS
  want = -log_sigmoid(beta * a_w - beta * a_l - gamma)
  np.testing.assert_allclose(losses_of(kind='simpo', beta=beta, gamma=gamma), want, rtol=1e-5)


def test_orpo_is_the_chosen_nll_plus_lambda_times_the_odds_ratio_term():
  lam = 0.25
  p_w, p_l = np.exp(CHOSEN / CHOSEN_TOKENS), np.exp(REJECTED / REJECTED_TOKENS)
  odds = lambda p: p / (1 - p)
  nll = -CHOSEN / CHOSEN_TOKENS
  want = nll - lam * log_sigmoid(np.log(odds(p_w) / odds(p_l)))
  np.testing.assert_allclose(losses_of(kind='orpo', beta=lam), want, rtol=1e-5)


def test_rewards_margins_and_accuracy_follow_trl_with_ties_counted_half():
  loss = PreferenceLoss(kind='dpo', beta=0.1)
  p = logps()
  _, reward_w, reward_l = pair_losses(loss, p)
  np.testing.assert_allclose(reward_w, 0.1 * (CHOSEN - REF_CHOSEN), rtol=1e-5)
  np.testing.assert_allclose(reward_l, 0.1 * (REJECTED - REF_REJECTED), rtol=1e-5)
  metrics = pair_metrics(reward_w, reward_l, p)
  np.testing.assert_allclose(metrics['rewards/margins'], reward_w - reward_l)
  want = (0.1 * (CHOSEN - REF_CHOSEN) > 0.1 * (REJECTED - REF_REJECTED)).astype(float)
  np.testing.assert_array_equal(metrics['rewards/accuracies'], want)
  tie = pair_metrics(jnp.zeros(3), jnp.zeros(3), p)
  np.testing.assert_array_equal(tie['rewards/accuracies'], [0.5, 0.5, 0.5])
  simpo = PreferenceLoss(kind='simpo', beta=2.0)
  _, reward_w, _ = pair_losses(simpo, logps(False))
  np.testing.assert_allclose(reward_w, 2.0 * CHOSEN / CHOSEN_TOKENS, rtol=1e-5)


def test_dpo_at_the_reference_is_log_2_with_zero_margin():
  same = PairLogps(*(jnp.asarray(x, jnp.float32) for x in (CHOSEN, REJECTED, CHOSEN_TOKENS,
                                                          REJECTED_TOKENS, CHOSEN, REJECTED)))
  value, reward_w, reward_l = pair_losses(PreferenceLoss(beta=0.1), same)
  np.testing.assert_array_equal(value, np.full(6, np.float32(np.log(2))))
  np.testing.assert_array_equal(reward_w - reward_l, np.zeros(6))


def test_the_dpo_gradient_vanishes_as_beta_goes_to_zero():
  """d loss / d log pi(y_w) = -beta s(-beta D): -beta / 2 per pair as beta -> 0."""
  def grad(beta):
    loss = PreferenceLoss(beta=beta)
    return np.asarray(jax.grad(lambda c: pair_losses(loss, logps()._replace(chosen=c))[0].sum())(
        jnp.asarray(CHOSEN, jnp.float32)), np.float64)
  delta = (CHOSEN - REF_CHOSEN) - (REJECTED - REF_REJECTED)
  for beta in (1.0, 1e-2, 1e-4):
    np.testing.assert_allclose(grad(beta), -beta / (1 + np.exp(beta * delta)), rtol=1e-5)
  assert np.abs(grad(1e-6)).max() < 1e-6


def test_empty_padding_pairs_give_finite_values_and_gradients():
  empty = PairLogps(*(jnp.zeros(2) for _ in range(6)))
  for kind in ('dpo', 'ipo', 'simpo', 'orpo'):
    loss = PreferenceLoss(kind=kind)
    value, grad = jax.value_and_grad(lambda c: pair_losses(loss, empty._replace(chosen=c))[0].sum())(
        jnp.zeros(2))
    assert np.isfinite(value) and np.isfinite(grad).all(), kind


@pytest.mark.parametrize('settings, message', [
    ({'kind': 'kto'}, 'loss.kind must be one of'),
    ({'beta': 0.0}, 'loss.beta must be > 0'),
    ({'label_smoothing': 0.5}, 'loss.label_smoothing must be in [0, 0.5)'),
    ({'kind': 'ipo', 'label_smoothing': 0.1}, "applies to kind 'dpo' and 'simpo'"),
    ({'beta': 'big'}, 'loss.beta must be a finite number'),
    ({'kind': 'simpo', 'gamma': -0.5}, 'loss.gamma is the target reward margin of simpo and '
     'must be >= 0, got -0.5'),
    ({'beta': float('inf')}, 'loss.beta must be a finite number, got inf'),
    ({'gamma': float('nan')}, 'loss.gamma must be a finite number, got nan'),
])
def test_bad_settings_are_one_line_errors(settings, message):
  with pytest.raises(UserError, match=message.replace('[', r'\[').replace(')', r'\)')):
    PreferenceLoss(**settings)


def test_the_reference_kinds_need_reference_log_probs():
  with pytest.raises(ValueError, match='needs the reference'):
    pair_losses(PreferenceLoss(kind='dpo'), logps(False))
