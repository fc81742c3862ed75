"""GRPO's objective against float64 numpy computations of the paper's formulas (Shao et al.
2024, eq. 3 with the k3 KL of eq. 4; TRL's std with Bessel's correction): group-normalised
advantages, the clipped per-token loss and its token/sequence averages; with a constant
reward the gradient of the loss on a LoRA LM is the KL term's alone (zero at beta 0); the
training batch scores exactly the completion tokens; bad settings are one-line errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.errors import UserError
from paxlike.layers import TransformerLM
from paxlike.trainer import grpo, rewards
from paxlike.trainer.grpo_loss import (STD_EPS, GrpoLoss, group_advantages, token_terms,
                                       token_weights)

RNG = np.random.default_rng(0)
N, T, G = 6, 5, 3
LOGPS = -RNG.uniform(0.1, 3, (N, T))
OLD = LOGPS + RNG.normal(0, 0.3, (N, T))   # Ratios well outside 1 +- 0.2 for some tokens.
REF = LOGPS + RNG.normal(0, 0.5, (N, T))
MASK = (np.arange(T)[None] < RNG.integers(1, T + 1, N)[:, None]).astype(np.float64)
REWARDS = np.array([1.0, 0.0, 0.5, 2.0, 2.0, 2.0])  # The second group is constant.


def f32(x):
  return jnp.asarray(x, jnp.float32)


def numpy_advantages(rewards, g, scale=True):
  groups = rewards.reshape(-1, g)
  centred = groups - groups.mean(axis=1, keepdims=True)
  if scale:
    centred = centred / (groups.std(axis=1, ddof=1, keepdims=True) + STD_EPS)
  return centred.reshape(-1)


def numpy_token_loss(logps, old, ref, adv, eps, beta):
  ratio = np.exp(logps - old)
  a = adv[:, None]
  objective = np.minimum(ratio * a, np.clip(ratio, 1 - eps, 1 + eps) * a)
  kl = np.exp(ref - logps) - (ref - logps) - 1
  return -objective + beta * kl, kl, ratio


def test_advantages_are_rewards_normalised_within_each_group():
  got = np.asarray(group_advantages(f32(REWARDS), G))
  np.testing.assert_allclose(got, numpy_advantages(REWARDS, G), rtol=1e-5, atol=1e-6)
  assert np.all(got[3:] == 0)  # A constant group teaches nothing.
  np.testing.assert_allclose(np.asarray(group_advantages(f32(REWARDS), G, 'none')),
                             numpy_advantages(REWARDS, G, scale=False), atol=1e-6)


@pytest.mark.parametrize('eps, beta', [(0.2, 0.04), (0.1, 0.0)])
def test_token_terms_are_the_clipped_objective_plus_the_k3_kl(eps, beta):
  adv = numpy_advantages(REWARDS, G)
  terms = token_terms(f32(LOGPS), f32(OLD), f32(REF) if beta else None, f32(adv), f32(MASK),
                      eps, beta)
  want, kl, ratio = numpy_token_loss(LOGPS, OLD, REF, adv, eps, beta)
  np.testing.assert_allclose(np.asarray(terms.loss), want * MASK, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(np.asarray(terms.kl), (kl if beta else 0 * kl) * MASK, rtol=1e-4,
                             atol=1e-6)
  a = adv[:, None]
  clipped = ((ratio < 1 - eps) & (a < 0)) | ((ratio > 1 + eps) & (a > 0))
  np.testing.assert_array_equal(np.asarray(terms.clipped), clipped * MASK)
  assert 0 < (clipped * MASK).sum() < MASK.sum()  # The example clips some tokens, not all.


def trl_advantages(rewards, g, scale_rewards):
  """TRL's GRPOTrainer._generate_and_score_completions (sum_then_normalize), in numpy."""
  mean_grouped = np.repeat(rewards.reshape(-1, g).mean(axis=1), g)
  if scale_rewards in ('group', 'none'):
    std = np.repeat(rewards.reshape(-1, g).std(axis=1, ddof=1), g)
  else:  # 'batch'
    std = np.full_like(rewards, rewards.std(ddof=1))
  advantages = rewards - mean_grouped
  if scale_rewards != 'none':
    advantages = advantages / (std + 1e-4)
  return advantages


def trl_loss(logps, old, ref, adv, mask, loss_type, eps, eps_high, beta, max_len):
  """TRL's GRPOTrainer._compute_loss (token-level importance sampling, one process, no
  gradient accumulation: num_items_in_batch is the batch's completion tokens), in numpy:
  (loss, clipped tokens)."""
  coef_1 = np.exp(logps - old)
  coef_2 = np.clip(coef_1, 1 - eps, 1 + eps_high)
  a = adv[:, None]
  per_token_loss = -np.minimum(coef_1 * a, coef_2 * a)
  per_token_loss = per_token_loss + beta * (np.exp(ref - logps) - (ref - logps) - 1)
  if loss_type == 'grpo':
    loss = ((per_token_loss * mask).sum(-1) / np.maximum(mask.sum(-1), 1.0)).mean()
  elif loss_type == 'bnpo':
    loss = (per_token_loss * mask).sum() / max(mask.sum(), 1.0)
  elif loss_type == 'dr_grpo':
    loss = (per_token_loss * mask).sum() / (per_token_loss.shape[0] * max_len)
  else:  # dapo
    loss = (per_token_loss * mask).sum() / max(mask.sum(), 1.0)
  clipped = ((coef_1 < 1 - eps) & (a < 0)) | ((coef_1 > 1 + eps_high) & (a > 0))
  return loss, clipped * mask


@pytest.mark.parametrize('scale', ['group', 'batch', 'none'])
def test_advantages_are_trls_for_each_scale_rewards(scale):
  got = np.asarray(group_advantages(f32(REWARDS), G, scale))
  np.testing.assert_allclose(got, trl_advantages(REWARDS, G, scale), rtol=1e-5, atol=1e-6)
  assert GrpoLoss(reward_fns=(rewards.exact_match,), scale_rewards=scale).scale_rewards == scale


@pytest.mark.parametrize('loss_type', ['grpo', 'bnpo', 'dr_grpo', 'dapo'])
@pytest.mark.parametrize('eps_high', [None, 0.4])
def test_the_loss_is_trls_for_each_loss_type_and_epsilon_high(loss_type, eps_high):
  adv = trl_advantages(REWARDS, G, 'group')
  want, want_clipped = trl_loss(LOGPS, OLD, REF, adv, MASK, loss_type, 0.2,
                                0.2 if eps_high is None else eps_high, 0.04, T)
  terms = token_terms(f32(LOGPS), f32(OLD), f32(REF), f32(adv), f32(MASK), 0.2, 0.04, eps_high)
  np.testing.assert_array_equal(np.asarray(terms.clipped), want_clipped)
  weights, count = token_weights(f32(MASK), loss_type, T)
  assert float(jnp.sum(terms.loss * weights) / count) == pytest.approx(want, rel=1e-5)
  assert GrpoLoss(reward_fns=(rewards.exact_match,), loss_type=loss_type).loss_type == loss_type


def test_clip_higher_clips_fewer_tokens_above_and_the_same_below():
  adv = trl_advantages(REWARDS, G, 'group')
  plain = token_terms(f32(LOGPS), f32(OLD), None, f32(adv), f32(MASK), 0.2, 0.0)
  higher = token_terms(f32(LOGPS), f32(OLD), None, f32(adv), f32(MASK), 0.2, 0.0, 0.4)
  ratio, a = np.exp(LOGPS - OLD), adv[:, None]
  between = (ratio > 1.2) & (ratio <= 1.4) & (a > 0) & (MASK > 0)
  assert between.any()  # The example has tokens the higher bound no longer clips.
  np.testing.assert_array_equal(np.asarray(plain.clipped) - np.asarray(higher.clipped),
                                between.astype(np.float32))


def test_the_grpo_sequence_average_leaves_empty_completions_out_of_its_denominator():
  adv = trl_advantages(REWARDS, G, 'group')
  mask = MASK.copy()
  mask[1] = 0.0  # A completion with no scored token.
  per_token, _, _ = numpy_token_loss(LOGPS, OLD, REF, adv, 0.2, 0.04)
  kept = mask.sum(axis=1) > 0
  want = np.mean((per_token * mask).sum(axis=1)[kept] / mask.sum(axis=1)[kept])
  terms = token_terms(f32(LOGPS), f32(OLD), f32(REF), f32(adv), f32(mask), 0.2, 0.04)
  weights, count = token_weights(f32(mask), 'grpo')
  assert float(count) == N - 1
  assert float(jnp.sum(terms.loss * weights) / count) == pytest.approx(want, rel=1e-5)
  trl, _ = trl_loss(LOGPS, OLD, REF, adv, mask, 'grpo', 0.2, 0.2, 0.04, T)
  assert trl == pytest.approx(want * (N - 1) / N, rel=1e-5)  # TRL divides by all N rows.


@pytest.mark.parametrize('old, new', [('token', 'dapo'), ('sequence', 'grpo')])
def test_earlier_configs_loss_type_names_read_as_trls(old, new):
  assert GrpoLoss(reward_fns=(rewards.exact_match,), loss_type=old).loss_type == new
  a, b = token_weights(f32(MASK), old), token_weights(f32(MASK), new)
  np.testing.assert_array_equal(np.asarray(a[0]), np.asarray(b[0]))
  assert float(a[1]) == float(b[1])


TINY_LORA_LM = TransformerLM(vocab_size=32, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                             max_len=16, lora_rank=2, lora_targets=('query', 'value'))


@jax.jit  # One program: eagerly, every op of the init compiles on its own.
def _tiny_lora_params(tokens):
  params = TINY_LORA_LM.init(jax.random.key(0), tokens)['params']
  # Adapters away from their zero init, so that the policy differs from the base.
  return jax.tree_util.tree_map_with_path(
      lambda path, x: x + 0.3 * jax.random.normal(jax.random.key(len(str(path))), x.shape)
      if 'lora' in str(path) else x, params)


def _tiny_lora_lm():
  model = TINY_LORA_LM
  tokens = jnp.asarray(RNG.integers(1, 32, (4, 9)), jnp.int32)
  params = _tiny_lora_params(tokens[:, :-1])
  mask = np.zeros((4, 8), np.float32)
  mask[:, 4:] = 1.0  # The completion: the last 4 targets.
  batch = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:], 'mask': jnp.asarray(mask),
           'rewards': jnp.full((4,), 0.7)}
  return model, params, batch


@pytest.mark.parametrize('beta', [0.0, 0.1])
def test_with_a_constant_reward_the_gradient_is_the_kl_terms_alone(beta):
  model, params, batch = _tiny_lora_lm()
  loss = GrpoLoss(reward_fns=(rewards.exact_match,), num_generations=2, beta=beta)
  scored = jax.tree.map(lambda x: x[0, 0],
                        jax.jit(grpo.scorer(model, loss))(
                            params, jax.tree.map(lambda x: x[None, None], batch)))
  assert np.all(np.asarray(scored['advantages']) == 0)
  grads = jax.jit(jax.grad(lambda p: grpo.grpo_loss_fn(model, loss)(p, scored, None)[0]))(params)

  def kl_only(p):  # beta * the mean k3 KL over the completion tokens, written out.
    logits = model.apply({'params': p}, batch['inputs'])
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), batch['targets'][..., None], -1)[..., 0]
    if not beta:
      return 0.0 * jnp.sum(logp)
    delta = scored['ref_logps'] - logp
    return beta * jnp.sum((jnp.exp(delta) - delta - 1) * batch['mask']) / jnp.sum(batch['mask'])
  want = jax.jit(jax.grad(kl_only))(params)
  for got, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=2e-4, atol=1e-7)
  norm = sum(float(np.sum(np.asarray(g)**2)) for g in jax.tree.leaves(grads))
  assert (norm == 0.0) if not beta else norm > 0


def test_the_training_batch_scores_exactly_the_completion_tokens():
  prompts = [np.array([5, 6, 7]), np.array([9])]
  completions = [np.array([1, 2, 10]), np.array([3, 10])]
  batch = grpo.train_batch(prompts, completions, width=6, pad_id=0)
  np.testing.assert_array_equal(batch['inputs'], [[5, 6, 7, 1, 2, 0], [9, 3, 0, 0, 0, 0]])
  np.testing.assert_array_equal(batch['targets'], [[6, 7, 1, 2, 10, 0], [3, 10, 0, 0, 0, 0]])
  np.testing.assert_array_equal(batch['mask'], [[0, 0, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0]])


@pytest.mark.parametrize('settings, words', [
    ({'num_generations': 1}, 'at least 2'),
    ({'temperature': 0.0}, 'temperature'),
    ({'epsilon': 1.5}, 'epsilon'),
    ({'loss_type': 'luspo'}, 'loss_type'),
    ({'scale_rewards': 'std'}, 'scale_rewards'),
    ({'epsilon_high': -0.1}, 'epsilon_high'),
    ({'epsilon_high': 'wide'}, 'epsilon_high'),
    ({'beta': float('nan')}, 'loss.beta must be a finite number, got nan'),
    ({'temperature': float('inf')}, 'loss.temperature must be a finite number'),
    ({'reward_fns': ()}, 'at least one reward function'),
    ({'reward_fns': ('os.system',)}, 'not allowed'),
    ({'reward_weights': (1.0, 2.0)}, 'one weight per reward function'),
])
def test_bad_settings_are_one_line_errors(settings, words):
  settings = {'reward_fns': (rewards.exact_match,), **settings}
  with pytest.raises(UserError, match=words) as error:
    GrpoLoss(**settings)
  assert '\n' not in str(error.value)


def test_num_iterations_takes_that_many_updates_from_the_sampling_policys_logps():
  import optax
  from paxlike.trainer.centralized import centralized
  model, params, batch = _tiny_lora_lm()
  batch['rewards'] = jnp.asarray([1.0, 0.0, 0.0, 1.0])
  loss = GrpoLoss(reward_fns=(rewards.exact_match,), num_generations=2, beta=0.1,
                  num_iterations=2)
  batches = grpo.scorer(model, loss)(params, jax.tree.map(lambda x: x[None, None], batch))
  np.testing.assert_array_equal(  # The old log-probs are the params' that sampled.
      batches['old_logps'][0, 0], grpo.token_logps(model, params, jax.tree.map(
          lambda x: x[0, 0], batches), loss.temperature))
  alg = centralized(grpo.grpo_loss_fn(model, loss), optax.adam(1e-2))
  state, weights, rng = alg.init(params), jnp.ones(1), jax.random.key(3)
  twice, metrics = jax.jit(grpo.repeated(alg, 2).next)(state, batches, weights, rng)
  step = jax.jit(alg.next)  # One program for both single updates.
  once, first = step(state, batches, weights, jax.random.split(rng, 2)[0])
  again, second = step(once, batches, weights, jax.random.split(rng, 2)[1])
  for got, want in zip(jax.tree.leaves(twice), jax.tree.leaves(again)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-7)
  assert float(first['clip_ratio']) == 0  # Iteration 1: the ratio is exactly 1.
  assert float(metrics['loss']) == pytest.approx((float(first['loss']) + float(second['loss'])) / 2,
                                                 rel=1e-4)
