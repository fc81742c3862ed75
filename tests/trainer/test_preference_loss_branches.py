"""Every branch of the non-GRPO preference losses (paxlike/trainer/preference_loss.py and the
pair LossFn of paxlike/trainer/preference.py) against independent float64 numpy transcriptions
of TRL's own loss code (huggingface/trl, read at f2cd577, 1.10.0.dev0; test_dpo_loss.py checks
the same kinds against the papers' formulas instead):

  DPO  trl/trainer/dpo_trainer.py DPOTrainer._compute_loss: loss_type 'sigmoid', 'ipo' (log-ratio
       sums over the completion's tokens, clamped at 1) and 'robust'; conservative DPO is the
       'sigmoid' loss with label_smoothing as TRL had it until the refactor e3b7897c8 (1.x
       ignores label_smoothing there).
  SimPO trl/experimental/cpo/cpo_trainer.py CPOTrainer.cpo_loss, loss_type 'simpo' with
       cpo_alpha=0 (TRL's SimPO recipe) and alpha=0, on get_batch_logps(average_log_prob=True).
  ORPO trl/experimental/orpo/orpo_trainer.py odds_ratio_loss, log1mexp and concatenated_forward
       (its NLL: a cross-entropy over the chosen rows' prompt + completion tokens).

For each: per-pair loss in float64 (1e-12) and float32 (2e-6, of the inputs rounded to
float32), the gradient with respect to the policy's sequence log-probs (central differences of
the numpy transcription), the logged metrics (TRL's means over pairs), and the whole LossFn
from a model's logits: prompt and padding targets masked out, log-probs summed (per-token means
where TRL averages), pairs interleaved (TRL: chosen rows then rejected rows), padding pairs
left out of the means, and its gradient with respect to the logits; the held-out eval step's
means alike. Where paxlike departs from TRL on purpose (README, "Conventions beside TRL's"),
the paxlike convention is asserted and so is the numeric difference from TRL's value: the tie's
accuracy (0.5 against 0), label_smoothing (conservative DPO against TRL 1.x's 'robust'), ORPO's
NLL (the chosen completion, per pair, against TRL's prompt + chosen token mean over the batch),
`logps/*` (sums against the CPO/ORPO trainers' per-token means)."""

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.errors import UserError
from paxlike.trainer import preference, reference
from paxlike.trainer.preference_loss import (KINDS, METRICS, PairLogps, PreferenceLoss,
                                             log1mexp, pair_losses, pair_metrics)

PAIRS = 8
RNG = np.random.default_rng(69)
CHOSEN_TOKENS = RNG.integers(1, 40, PAIRS).astype(np.float64)
REJECTED_TOKENS = RNG.integers(1, 40, PAIRS).astype(np.float64)
CHOSEN = -CHOSEN_TOKENS * RNG.uniform(0.2, 3.0, PAIRS)  # Per-token means in [-3, -0.2].
REJECTED = -REJECTED_TOKENS * RNG.uniform(0.2, 3.0, PAIRS)
REF_CHOSEN = CHOSEN + RNG.normal(0, 3, PAIRS)
REF_REJECTED = REJECTED + RNG.normal(0, 3, PAIRS)

# Each kind with settings away from the defaults where it has any.
CASES = {
    'dpo': dict(kind='dpo', beta=0.3),
    'cdpo': dict(kind='dpo', beta=0.3, label_smoothing=0.2),
    'ipo': dict(kind='ipo', beta=0.4),
    'ipo_summed': dict(kind='ipo', beta=0.4, ipo_average=False),
    'simpo': dict(kind='simpo', beta=2.5, gamma=0.7),
    'simpo_smoothed': dict(kind='simpo', beta=2.5, gamma=0.7, label_smoothing=0.15),
    'orpo': dict(kind='orpo', beta=0.25),
}


# ---- TRL, transcribed into float64 numpy ------------------------------------------------------

def logsigmoid(x):
  x = np.asarray(x, np.float64)
  return np.minimum(x, 0.0) - np.log1p(np.exp(-np.abs(x)))


def trl_log1mexp(x):
  """orpo_trainer.log1mexp."""
  t = -0.6931471805599453
  with np.errstate(divide='ignore', invalid='ignore'):
    return np.where(x < t, np.log1p(-np.exp(x)), np.log(-np.expm1(x)))


def trl_dpo_sigmoid(chosen, rejected, ref_chosen, ref_rejected, beta, label_smoothing=0.0):
  """DPOTrainer 'sigmoid' (reverse KL): -logsigmoid(beta * delta_score); with label_smoothing as
  TRL computed it before e3b7897c8 (conservative DPO)."""
  delta_score = (chosen - ref_chosen) - (rejected - ref_rejected)
  return (-logsigmoid(beta * delta_score) * (1 - label_smoothing)
          - logsigmoid(-beta * delta_score) * label_smoothing)


def trl_dpo_robust(chosen, rejected, ref_chosen, ref_rejected, beta, label_smoothing):
  """DPOTrainer 'robust' (1.x): (clean - flipped) / (1 - 2 eps)."""
  delta_score = (chosen - ref_chosen) - (rejected - ref_rejected)
  clean = -(1 - label_smoothing) * logsigmoid(beta * delta_score)
  flipped = -label_smoothing * logsigmoid(-beta * delta_score)
  return (clean - flipped) / (1 - 2 * label_smoothing)


def trl_dpo_ipo(chosen, rejected, ref_chosen, ref_rejected, chosen_tokens, rejected_tokens, beta):
  """DPOTrainer 'ipo': each log-ratio over its completion's tokens (clamped at 1), Eq. 17."""
  chosen_avg = (chosen - ref_chosen) / np.maximum(chosen_tokens, 1.0)
  rejected_avg = (rejected - ref_rejected) / np.maximum(rejected_tokens, 1.0)
  return (chosen_avg - rejected_avg - 1 / (2 * beta)) ** 2


def ipo_summed(chosen, rejected, ref_chosen, ref_rejected, beta):
  """Eq. 17 on summed log-ratios: TRL's 'ipo' without its per-token division."""
  return ((chosen - ref_chosen) - (rejected - ref_rejected) - 1 / (2 * beta)) ** 2


def trl_cpo_simpo(chosen_avg, rejected_avg, beta, gamma, label_smoothing=0.0):
  """CPOTrainer.cpo_loss, loss_type 'simpo', alpha 0, on per-token mean log-probs."""
  logits = chosen_avg - rejected_avg
  logits = logits - gamma / beta
  return (-logsigmoid(beta * logits) * (1 - label_smoothing)
          - logsigmoid(-beta * logits) * label_smoothing)


def trl_orpo_ratio(chosen_avg, rejected_avg, beta):
  """ORPOTrainer.odds_ratio_loss's `losses` (beta * log s(log odds)); the trainer's loss is
  nll - mean(losses)."""
  log_odds = (chosen_avg - rejected_avg) - (trl_log1mexp(chosen_avg) - trl_log1mexp(rejected_avg))
  return beta * logsigmoid(log_odds)


def trl_per_pair(case, chosen, rejected, ref_chosen, ref_rejected, chosen_tokens,
                 rejected_tokens):
  """Each pair's loss of CASES[case] as TRL computes it (for ORPO: with the paper's per-pair NLL
  of the chosen completion, paxlike's convention; TRL's batch NLL is checked separately)."""
  s = CASES[case]
  if case in ('dpo', 'cdpo'):
    return trl_dpo_sigmoid(chosen, rejected, ref_chosen, ref_rejected, s['beta'],
                           s.get('label_smoothing', 0.0))
  if case == 'ipo':
    return trl_dpo_ipo(chosen, rejected, ref_chosen, ref_rejected, chosen_tokens,
                       rejected_tokens, s['beta'])
  if case == 'ipo_summed':
    return ipo_summed(chosen, rejected, ref_chosen, ref_rejected, s['beta'])
  chosen_avg, rejected_avg = chosen / chosen_tokens, rejected / rejected_tokens
  if case.startswith('simpo'):
    return trl_cpo_simpo(chosen_avg, rejected_avg, s['beta'], s['gamma'],
                         s.get('label_smoothing', 0.0))
  return -chosen_avg - trl_orpo_ratio(chosen_avg, rejected_avg, s['beta'])


def trl_metrics(kind, beta, chosen, rejected, ref_chosen, ref_rejected, chosen_tokens,
                rejected_tokens):
  """The means TRL logs: DPOTrainer (dpo, ipo) on summed log-probs; CPOTrainer (simpo) and
  ORPOTrainer on per-token means, rewards and logps alike; accuracies strictly greater."""
  if kind in ('dpo', 'ipo'):
    logps_w, logps_l = chosen, rejected
    reward_w, reward_l = beta * (chosen - ref_chosen), beta * (rejected - ref_rejected)
  else:
    logps_w, logps_l = chosen / chosen_tokens, rejected / rejected_tokens
    reward_w, reward_l = beta * logps_w, beta * logps_l
  return {'rewards/chosen': reward_w.mean(), 'rewards/rejected': reward_l.mean(),
          'rewards/accuracies': (reward_w > reward_l).astype(np.float64).mean(),
          'rewards/margins': (reward_w - reward_l).mean(),
          'logps/chosen': logps_w.mean(), 'logps/rejected': logps_l.mean()}


def central_difference(f, x, step=1e-6):
  """d f(x)_i / dx_i for each i, f elementwise over pairs, in float64."""
  return (f(x + step) - f(x - step)) / (2 * step)


# ---- paxlike ----------------------------------------------------------------------------------

def pax_logps(dtype, chosen=CHOSEN, rejected=REJECTED, ref_chosen=REF_CHOSEN,
              ref_rejected=REF_REJECTED, chosen_tokens=CHOSEN_TOKENS,
              rejected_tokens=REJECTED_TOKENS, with_reference=True) -> PairLogps:
  f = lambda x: jnp.asarray(x, dtype)
  refs = (f(ref_chosen), f(ref_rejected)) if with_reference else (None, None)
  return PairLogps(f(chosen), f(rejected), f(chosen_tokens), f(rejected_tokens), *refs)


def rounded(x, dtype):
  """x as the float32 (or float64) inputs hold it, in float64."""
  return np.asarray(x, dtype).astype(np.float64)


DTYPES = [pytest.param(np.float64, 1e-12, id='float64'),
          pytest.param(np.float32, 2e-6, id='float32')]  # Measured: 4e-16 and 4e-7 at most.


# ---- per-pair losses, each kind and option ----------------------------------------------------

@pytest.mark.parametrize('dtype, rtol', DTYPES)
@pytest.mark.parametrize('case', list(CASES))
def test_each_kinds_per_pair_loss_is_trls(case, dtype, rtol):
  loss = PreferenceLoss(**CASES[case])
  with jax.enable_x64(dtype == np.float64):
    value, _, _ = pair_losses(loss, pax_logps(dtype))
    assert value.dtype == dtype
    got = np.asarray(value, np.float64)
  inputs = [rounded(x, dtype) for x in (CHOSEN, REJECTED, REF_CHOSEN, REF_REJECTED,
                                        CHOSEN_TOKENS, REJECTED_TOKENS)]
  want = trl_per_pair(case, *inputs)
  np.testing.assert_allclose(got, want, rtol=rtol)


@pytest.mark.parametrize('case', list(CASES))
def test_each_kinds_gradient_in_the_policy_log_probs_is_trls(case):
  """d loss / d log pi(y_w|x) and d / d log pi(y_l|x) per pair, float64, against central
  differences of the numpy transcription; the reference's, inputs here, enter with the opposite
  sign (the LossFn stops their gradient: the logits test below)."""
  loss = PreferenceLoss(**CASES[case])
  with jax.enable_x64(True):
    p = pax_logps(np.float64, with_reference=loss.needs_reference)
    total = lambda c, r, rc, rr: pair_losses(
        loss, p._replace(chosen=c, rejected=r, ref_chosen=rc, ref_rejected=rr))[0].sum()
    if loss.needs_reference:
      grads = jax.grad(total, argnums=(0, 1, 2, 3))(p.chosen, p.rejected, p.ref_chosen,
                                                    p.ref_rejected)
    else:
      grads = jax.grad(total, argnums=(0, 1))(p.chosen, p.rejected, None, None)
    grads = [np.asarray(g, np.float64) for g in grads]
  rest = (REF_CHOSEN, REF_REJECTED, CHOSEN_TOKENS, REJECTED_TOKENS)
  want_w = central_difference(lambda c: trl_per_pair(case, c, REJECTED, *rest), CHOSEN)
  want_l = central_difference(lambda r: trl_per_pair(case, CHOSEN, r, *rest), REJECTED)
  assert np.abs(want_w).min() > 1e-4 and np.abs(want_l).min() > 1e-4  # Every pair pulls.
  np.testing.assert_allclose(grads[0], want_w, rtol=1e-6)
  np.testing.assert_allclose(grads[1], want_l, rtol=1e-6)
  if loss.needs_reference:  # The reference's log-probs are inputs: a gradient is -the policy's.
    np.testing.assert_allclose(grads[2], -want_w, rtol=1e-6)
    np.testing.assert_allclose(grads[3], -want_l, rtol=1e-6)


def test_conservative_dpo_is_trls_old_sigmoid_not_trl_1x_robust():
  """label_smoothing e on dpo: TRL's pre-1.x 'sigmoid' (above), not 1.x 'robust', which is the
  unbiased in expectation instead: the flipped term's sign reversed, divided by 1 - 2e."""
  beta, e = 0.3, 0.2
  loss = PreferenceLoss(kind='dpo', beta=beta, label_smoothing=e)
  with jax.enable_x64(True):
    got = np.asarray(pair_losses(loss, pax_logps(np.float64))[0])
  conservative = trl_dpo_sigmoid(CHOSEN, REJECTED, REF_CHOSEN, REF_REJECTED, beta, e)
  robust = trl_dpo_robust(CHOSEN, REJECTED, REF_CHOSEN, REF_REJECTED, beta, e)
  np.testing.assert_allclose(got, conservative, rtol=1e-12)
  z = beta * ((CHOSEN - REF_CHOSEN) - (REJECTED - REF_REJECTED))
  # From the two formulas: robust = (conservative + 2e log s(-z)) / (1 - 2e).
  np.testing.assert_allclose(robust, (got + 2 * e * logsigmoid(-z)) / (1 - 2 * e), rtol=1e-9)
  assert np.abs(robust - got).min() > 1e-2
  # And without smoothing both are TRL 1.x's 'sigmoid'.
  with jax.enable_x64(True):
    plain = np.asarray(pair_losses(PreferenceLoss(kind='dpo', beta=beta),
                                   pax_logps(np.float64))[0])
  np.testing.assert_allclose(plain, trl_dpo_robust(CHOSEN, REJECTED, REF_CHOSEN, REF_REJECTED,
                                                   beta, 0.0), rtol=1e-12)


def test_ipo_average_divides_each_log_ratio_by_its_own_completions_tokens():
  """ipo_average=True is TRL's division (chosen by chosen tokens, rejected by rejected tokens);
  False is the paper's sums, and the two differ wherever the lengths do."""
  loss_avg, loss_sum = (PreferenceLoss(kind='ipo', beta=0.4, ipo_average=a) for a in (True, False))
  with jax.enable_x64(True):
    avg = np.asarray(pair_losses(loss_avg, pax_logps(np.float64))[0])
    summed = np.asarray(pair_losses(loss_sum, pax_logps(np.float64))[0])
    swapped = np.asarray(pair_losses(loss_avg, pax_logps(
        np.float64, chosen_tokens=REJECTED_TOKENS, rejected_tokens=CHOSEN_TOKENS))[0])
  np.testing.assert_allclose(avg, trl_dpo_ipo(CHOSEN, REJECTED, REF_CHOSEN, REF_REJECTED,
                                              CHOSEN_TOKENS, REJECTED_TOKENS, 0.4), rtol=1e-12)
  np.testing.assert_allclose(summed, ipo_summed(CHOSEN, REJECTED, REF_CHOSEN, REF_REJECTED, 0.4),
                             rtol=1e-12)
  differ = CHOSEN_TOKENS != REJECTED_TOKENS
  assert differ.any()
  assert (swapped[differ] != avg[differ]).all()
  assert (np.abs(avg - summed) > 1e-3).all()


def test_options_reach_only_their_own_kinds():
  """gamma only moves simpo, ipo_average only ipo, and the reference log-probs only the kinds
  that have one (simpo and orpo are reference-free: needs_reference False, and given reference
  log-probs change nothing)."""
  with jax.enable_x64(True):
    p = pax_logps(np.float64)
    shifted = p._replace(ref_chosen=p.ref_chosen + 5.0, ref_rejected=p.ref_rejected - 3.0)
    for kind in KINDS:
      base = np.asarray(pair_losses(PreferenceLoss(kind=kind), p)[0])
      gamma = np.asarray(pair_losses(PreferenceLoss(kind=kind, gamma=2.0), p)[0])
      average = np.asarray(pair_losses(PreferenceLoss(kind=kind, ipo_average=False), p)[0])
      moved_ref = np.asarray(pair_losses(PreferenceLoss(kind=kind), shifted)[0])
      for changed, applies in ((gamma, kind == 'simpo'), (average, kind == 'ipo'),
                               (moved_ref, kind in ('dpo', 'ipo'))):
        if applies:
          assert (changed != base).all(), kind
        else:
          np.testing.assert_array_equal(changed, base, err_msg=kind)
      assert PreferenceLoss(kind=kind).needs_reference == (kind in ('dpo', 'ipo'))
      assert reference.needs_copy(types.SimpleNamespace(lora_rank=0),
                                  PreferenceLoss(kind=kind)) == (kind in ('dpo', 'ipo'))
    free = np.asarray(pair_losses(PreferenceLoss(kind='simpo'), p._replace(
        ref_chosen=None, ref_rejected=None))[0])
    np.testing.assert_array_equal(free, np.asarray(pair_losses(PreferenceLoss(kind='simpo'),
                                                               p)[0]))


def test_simpos_gamma_is_a_margin_in_reward_units_as_trls_gamma_over_beta():
  """TRL subtracts gamma / beta from the per-token gap and then scales by beta: the loss at
  gap beta (a_w - a_l) = gamma is log 2 whatever beta."""
  for beta in (0.5, 2.5, 10.0):
    gamma = 0.7
    a_l = REJECTED / REJECTED_TOKENS
    chosen = (a_l + gamma / beta) * CHOSEN_TOKENS
    with jax.enable_x64(True):
      value = np.asarray(pair_losses(PreferenceLoss(kind='simpo', beta=beta, gamma=gamma),
                                     pax_logps(np.float64, chosen=chosen))[0])
    np.testing.assert_allclose(value, np.log(2.0), rtol=1e-12)
    np.testing.assert_allclose(value, trl_cpo_simpo(chosen / CHOSEN_TOKENS, a_l, beta, gamma),
                               rtol=1e-12)


def test_orpo_log1mexp_is_trls_and_finite_at_certainty():
  """log(1 - exp(x)) on both sides of TRL's branch point -ln 2 and far out; at x = 0 (a
  completion the model is sure of) TRL's is -inf and its loss NaN, paxlike's clips x to -1e-7."""
  x = np.array([-80.0, -30.0, -5.0, -0.7, -0.6931471805599453, -0.69, -0.1, -1e-3, -1e-6])
  with jax.enable_x64(True):
    got64 = np.asarray(log1mexp(jnp.asarray(x)))
  got32 = np.asarray(log1mexp(jnp.asarray(x, jnp.float32)), np.float64)
  want = trl_log1mexp(x)
  np.testing.assert_allclose(got64, want, rtol=1e-12)
  np.testing.assert_allclose(got32, trl_log1mexp(rounded(x, np.float32)), rtol=2e-6)
  assert np.isneginf(trl_log1mexp(np.array([0.0])))[0]
  with jax.enable_x64(True):
    at_zero = float(log1mexp(jnp.zeros(())))
  assert at_zero == pytest.approx(np.log(-np.expm1(-1e-7)), rel=1e-12)
  loss = PreferenceLoss(kind='orpo', beta=0.25)
  sure = PairLogps(*(jnp.asarray(v, jnp.float32) for v in ([0.0], [-4.0], [3.0], [2.0])))
  value, grad = jax.value_and_grad(lambda c: pair_losses(loss, sure._replace(chosen=c))[0].sum())(
      sure.chosen)
  assert np.isfinite(float(value)) and np.isfinite(np.asarray(grad)).all()


# ---- rewards, accuracies, logps ---------------------------------------------------------------

@pytest.mark.parametrize('case', list(CASES))
def test_logged_metrics_are_trls_but_logps_sums(case):
  """rewards/* as TRL's trainer of the kind logs them (DPOTrainer: beta * summed log-ratios,
  for ipo too; CPO/ORPO: beta * per-token means); logps/* are sums for every kind, where the
  CPO and ORPO trainers log per-token means: their difference is asserted."""
  settings = CASES[case]
  loss = PreferenceLoss(**settings)
  with jax.enable_x64(True):
    p = pax_logps(np.float64, with_reference=loss.needs_reference)
    _, reward_w, reward_l = pair_losses(loss, p)
    got = {k: float(np.mean(np.asarray(v))) for k, v in pair_metrics(reward_w, reward_l,
                                                                      p).items()}
  assert set(got) == set(METRICS)
  want = trl_metrics(loss.kind, loss.beta, CHOSEN, REJECTED, REF_CHOSEN, REF_REJECTED,
                     CHOSEN_TOKENS, REJECTED_TOKENS)
  for name in ('rewards/chosen', 'rewards/rejected', 'rewards/margins', 'rewards/accuracies'):
    assert got[name] == pytest.approx(want[name], rel=1e-12), name
  assert 0 < want['rewards/accuracies'] < 1  # Both outcomes occur in the pairs.
  assert got['logps/chosen'] == pytest.approx(CHOSEN.mean(), rel=1e-12)
  assert got['logps/rejected'] == pytest.approx(REJECTED.mean(), rel=1e-12)
  if loss.kind in ('simpo', 'orpo'):  # The documented difference: TRL logs per-token means.
    assert got['logps/chosen'] - want['logps/chosen'] == pytest.approx(
        np.mean(CHOSEN) - np.mean(CHOSEN / CHOSEN_TOKENS), rel=1e-12)
    assert abs(got['logps/chosen'] - want['logps/chosen']) > 1.0
  else:
    assert got['logps/chosen'] == pytest.approx(want['logps/chosen'], rel=1e-12)


@pytest.mark.parametrize('kind', KINDS)
def test_a_tie_counts_half_where_trl_counts_it_wrong(kind):
  """Three of eight pairs tie (equal rewards); paxlike's mean accuracy is TRL's plus 0.5 * 3/8."""
  chosen, rejected = CHOSEN.copy(), REJECTED.copy()
  ref_chosen, ref_rejected = REF_CHOSEN.copy(), REF_REJECTED.copy()
  tokens_w, tokens_l = CHOSEN_TOKENS.copy(), REJECTED_TOKENS.copy()
  ties = np.array([1, 4, 6])
  if kind in ('dpo', 'ipo'):  # Equal log-ratios (exactly: every value a binary fraction).
    chosen[ties], ref_chosen[ties] = -10.0, -10.5
    rejected[ties], ref_rejected[ties] = -20.0, -20.5
  else:  # Equal per-token means, over different lengths.
    tokens_w[ties], tokens_l[ties] = 4.0, 8.0
    chosen[ties], rejected[ties] = -6.0, -12.0
  loss = PreferenceLoss(kind=kind, beta=0.5)
  inputs = (chosen, rejected, ref_chosen, ref_rejected, tokens_w, tokens_l)
  with jax.enable_x64(True):
    p = pax_logps(np.float64, *inputs, with_reference=loss.needs_reference)
    _, reward_w, reward_l = pair_losses(loss, p)
    accuracy = np.asarray(pair_metrics(reward_w, reward_l, p)['rewards/accuracies'])
  np.testing.assert_array_equal(accuracy[ties], 0.5)
  trl = trl_metrics(kind, 0.5, *inputs)['rewards/accuracies']
  assert accuracy.mean() == pytest.approx(trl + 0.5 * len(ties) / PAIRS, rel=1e-12)


# ---- the LossFn from a model's logits ---------------------------------------------------------

VOCAB, LENGTH = 11, 14  # LENGTH tokens per row in TRL's layout; LENGTH - 1 targets.


class FixedLogits(nn.Module):
  """A 'model' whose logits are its only param, whatever the tokens: the loss's gradient in
  them is the gradient in the log-softmax inputs."""
  rows: int

  @nn.compact
  def __call__(self, inputs, deterministic=True):
    del deterministic
    return self.param('logits', nn.initializers.zeros, (self.rows, LENGTH - 1, VOCAB))


def trl_layout(seed: int):
  """PAIRS pairs in TRL's layout: input_ids [2P, LENGTH], chosen rows then rejected rows, a
  shared prompt (1 to 4 tokens) then a completion, then padding; completion_mask and
  attention_mask alike; the policy's and reference's logits over every position."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, VOCAB, (2 * PAIRS, LENGTH))
  prompt = rng.integers(1, 5, PAIRS)
  ids[PAIRS:, :4] = ids[:PAIRS, :4]  # The rejected rows' prompts are the chosen rows'.
  completion = rng.integers(1, LENGTH - 4, 2 * PAIRS)
  position = np.arange(LENGTH)
  start = np.concatenate([prompt, prompt])[:, None]
  end = start + completion[:, None]
  completion_mask = ((position >= start) & (position < end)).astype(np.float64)
  attention_mask = (position < end).astype(np.float64)
  policy = rng.normal(0, 2, (2 * PAIRS, LENGTH, VOCAB))
  ref = policy + rng.normal(0, 0.5, policy.shape)
  return ids, completion_mask, attention_mask, policy, ref


def log_softmax(logits):
  top = logits.max(-1, keepdims=True)
  return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def trl_logps(logits, ids, completion_mask):
  """selective_log_softmax(logits[:, :-1], ids[:, 1:]) with non-completion targets zeroed,
  summed over the row (DPOTrainer); and the count of scored targets (get_batch_logps's)."""
  per_token = np.take_along_axis(log_softmax(logits[:, :-1]), ids[:, 1:, None], -1)[..., 0]
  mask = completion_mask[:, 1:]
  return (per_token * mask).sum(1), mask.sum(1)


def trl_orpo_nll(logits, ids, attention_mask):
  """ORPOTrainer's chosen NLL: nn.CrossEntropyLoss (a mean over every target not -100) of the
  chosen rows, labels = ids where attention_mask, shifted: prompt and completion tokens."""
  chosen = slice(0, PAIRS)
  per_token = np.take_along_axis(log_softmax(logits[chosen, :-1]), ids[chosen, 1:, None],
                                 -1)[..., 0]
  labels_kept = attention_mask[chosen, 1:]
  return -(per_token * labels_kept).sum() / labels_kept.sum()


def interleaved(x):
  """TRL's [chosen rows; rejected rows] as paxlike's [c0, r0, c1, r1, ...]."""
  return np.stack([x[:PAIRS], x[PAIRS:]], 1).reshape(2 * PAIRS, *x.shape[1:])


def pax_batch_and_params(seed: int, padding_pairs: int = 2):
  """The same pairs as a paxlike pair batch (target c is token c + 1; mask the completion's
  targets) with `padding_pairs` empty pairs after them, and the params of FixedLogits holding
  the policy's logits and, as the frozen copy, the reference's."""
  ids, completion_mask, _, policy, ref = trl_layout(seed)
  pad = lambda x: np.concatenate([interleaved(x), np.zeros((2 * padding_pairs,) + x.shape[1:],
                                                           x.dtype)])
  ids_i, mask_i = pad(ids), pad(completion_mask)
  batch = {'inputs': jnp.asarray(ids_i[:, :-1], jnp.int32),
           'targets': jnp.asarray(ids_i[:, 1:], jnp.int32),
           'mask': jnp.asarray(mask_i[:, 1:], jnp.float32)}
  logits = lambda x: jnp.asarray(pad(x)[:, :-1], jnp.float32)
  params = {'logits': logits(policy), reference.REFERENCE: {'logits': logits(ref)}}
  return FixedLogits(rows=2 * (PAIRS + padding_pairs)), batch, params


def trl_loss_of_logps(case, sums, ref_sums, counts):
  """The batch loss of CASES[case] (mean over pairs) as a function of the [2P] summed policy
  log-probs in TRL's layout; ORPO with paxlike's per-pair NLL of the chosen completion."""
  w, l = slice(0, PAIRS), slice(PAIRS, None)
  return trl_per_pair(case, sums[w], sums[l], ref_sums[w], ref_sums[l], counts[w],
                      counts[l]).mean()


@pytest.mark.parametrize('case', list(CASES))
def test_the_loss_fn_from_logits_is_trls_with_its_gradient(case):
  """preference_loss_fn on a batch of 8 pairs and 2 padding pairs against TRL's pipeline from
  the same logits: completion targets only, summed; the pairs' mean loss and TRL's metrics;
  the gradient in the policy's logits is d loss / d logps (of TRL's formula) times the
  log-softmax's Jacobian on the completion targets, zero on prompt, padding and the copy."""
  ids, completion_mask, attention_mask, policy, ref = trl_layout(1)
  model, batch, params = pax_batch_and_params(1)
  loss = PreferenceLoss(**CASES[case])
  loss_fn = preference.preference_loss_fn(model, loss)
  (value, metrics), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params, batch,
                                                                               None)
  sums, counts = trl_logps(policy, ids, completion_mask)
  ref_sums, _ = trl_logps(ref, ids, completion_mask)
  assert (counts > 0).all() and (sums < 0).all()
  want = trl_loss_of_logps(case, sums, ref_sums, counts)
  assert float(value) == pytest.approx(want, rel=2e-6)
  w, l = slice(0, PAIRS), slice(PAIRS, None)
  want_metrics = trl_metrics(loss.kind, loss.beta, sums[w], sums[l], ref_sums[w], ref_sums[l],
                             counts[w], counts[l])
  want_metrics['logps/chosen'], want_metrics['logps/rejected'] = sums[w].mean(), sums[l].mean()
  for name in METRICS:
    assert float(metrics[name]) == pytest.approx(want_metrics[name], rel=2e-6, abs=1e-6), name
  # The gradient: g_n = d loss / d sums_n (central differences), through the log-softmax.
  g = np.array([central_difference(
      lambda x, n=n: trl_loss_of_logps(case, np.where(np.arange(2 * PAIRS) == n, x, sums),
                                       ref_sums, counts), sums[n]) for n in range(2 * PAIRS)])
  targets = ids[:, 1:]
  jacobian = np.eye(VOCAB)[targets] - np.exp(log_softmax(policy[:, :-1]))
  want_grad = g[:, None, None] * completion_mask[:, 1:, None] * jacobian
  got_grad = np.asarray(grads['logits'], np.float64)
  np.testing.assert_allclose(got_grad[:2 * PAIRS], interleaved(want_grad), rtol=2e-4,
                             atol=2e-7 * np.abs(want_grad).max())
  assert not got_grad[2 * PAIRS:].any()  # The padding pairs.
  assert not np.asarray(grads[reference.REFERENCE]['logits']).any()
  prompt_targets = interleaved((completion_mask[:, 1:] == 0))
  assert not got_grad[:2 * PAIRS][prompt_targets].any()


def test_orpos_nll_is_the_chosen_completions_per_pair_where_trls_is_prompt_and_chosen():
  """ORPO's loss is mean over pairs of (chosen completion NLL per token) - beta log s(log odds):
  TRL's odds-ratio term on the same per-token means, and TRL's NLL replaced. The difference
  from TRL's loss is exactly the two NLLs' (TRL's: prompt + chosen tokens, one mean over the
  batch's tokens), and it is large."""
  ids, completion_mask, attention_mask, policy, ref = trl_layout(2)
  model, batch, params = pax_batch_and_params(2, padding_pairs=0)
  beta = 0.25
  value, _ = jax.jit(preference.preference_loss_fn(model, PreferenceLoss(kind='orpo', beta=beta)))(
      params, batch, None)
  sums, counts = trl_logps(policy, ids, completion_mask)
  avg = sums / counts
  ratio_term = -trl_orpo_ratio(avg[:PAIRS], avg[PAIRS:], beta).mean()
  trl_nll = trl_orpo_nll(policy, ids, attention_mask)
  trl_loss = trl_nll + ratio_term  # ORPOTrainer: policy_nll_loss - losses.mean().
  paper_nll = np.mean(-avg[:PAIRS])
  assert float(value) == pytest.approx(paper_nll + ratio_term, rel=2e-6)
  assert float(value) - trl_loss == pytest.approx(paper_nll - trl_nll, rel=1e-4, abs=1e-5)
  assert abs(paper_nll - trl_nll) > 1e-2
  # Even on the completion tokens alone, TRL's one token mean over the batch weighs long
  # completions more than paxlike's mean of per-pair means.
  batch_token_mean = -sums[:PAIRS].sum() / counts[:PAIRS].sum()
  assert abs(batch_token_mean - paper_nll) > 1e-3


@pytest.mark.parametrize('case', ['dpo', 'ipo', 'simpo', 'orpo'])
def test_the_eval_step_means_are_the_train_loss_fns(case):
  """eval_step's held-out means (padding pairs masked out) equal the LossFn's, which are TRL's
  (previous test): the same per-pair values averaged alike."""
  model, batch, params = pax_batch_and_params(3)
  loss = PreferenceLoss(**CASES[case])
  value, metrics = jax.jit(preference.preference_loss_fn(model, loss))(params, batch, None)
  step = preference.eval_step(model, loss)
  out = jax.jit(lambda p, b, g: step(types.SimpleNamespace(params=p), b, g))(
      params, batch, jnp.zeros(2 * (PAIRS + 2), jnp.int32))
  collection, per_group = out['']
  computed = collection.compute()
  assert set(computed) == {'loss', *METRICS}
  assert float(computed['loss']) == pytest.approx(float(value), rel=1e-6)
  for name in METRICS:
    assert float(computed[name]) == pytest.approx(float(metrics[name]), rel=1e-6, abs=1e-6), name
  assert not np.asarray(per_group).any()


def test_reference_free_kinds_never_read_a_reference():
  """simpo and orpo train params without a frozen copy; dpo and ipo refuse them."""
  model, batch, params = pax_batch_and_params(4)
  policy = reference.policy(params)
  for kind in KINDS:
    loss_fn = jax.jit(preference.preference_loss_fn(model, PreferenceLoss(kind=kind)))
    if kind in ('simpo', 'orpo'):
      np.testing.assert_array_equal(loss_fn(policy, batch, None)[0],
                                    loss_fn(params, batch, None)[0])
    else:
      with pytest.raises(ValueError, match='frozen copy'):
        loss_fn(policy, batch, None)


# ---- bad options ------------------------------------------------------------------------------

@pytest.mark.parametrize('settings, message', [
    ({'beta': -0.1}, 'loss.beta must be > 0, got -0.1'),
    ({'kind': 'simpo', 'beta': -2.0}, 'loss.beta must be > 0, got -2.0'),
    ({'label_smoothing': -0.1}, 'loss.label_smoothing must be in [0, 0.5), got -0.1'),
    ({'kind': 'orpo', 'label_smoothing': 0.1}, "applies to kind 'dpo' and 'simpo', not 'orpo'"),
    ({'kind': 'sigmoid'}, "loss.kind must be one of dpo, ipo, simpo, orpo, got 'sigmoid'"),
    ({'kind': None}, 'loss.kind must be one of'),
    ({'beta': True}, 'loss.beta must be a finite number, got True'),
    ({'label_smoothing': float('nan')}, 'loss.label_smoothing must be a finite number'),
    ({'gamma': '0.5'}, "loss.gamma must be a finite number, got '0.5'"),
    ({'kind': 'ipo', 'ipo_average': 'yes'}, "loss.ipo_average must be True or False, got 'yes'"),
])
def test_bad_options_are_refused_in_one_line(settings, message):
  with pytest.raises(UserError) as error:
    PreferenceLoss(**settings)
  text = str(error.value)
  assert message in text
  assert '\n' not in text
