"""The preference loss of a tiny LoRA LM on pair batches: DPO's first loss is log 2 (the policy
is its reference), its gradient is the derivative of a float64 numpy computation of the DPO
formula from the model's logits, only completion targets count, the adapters-off reference is
bitwise the base model's, a full fine-tune's reference is its frozen copy (no gradient), and the
loss and data must agree."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from paxlike.data import LmData
from paxlike.data.preference_data import PreferenceData
from paxlike.errors import UserError
from paxlike.layers import TransformerLM
from paxlike.trainer import objectives, preference, reference
from paxlike.trainer.preference_loss import PreferenceLoss

BASE = TransformerLM(vocab_size=64, num_layers=1, d_model=32, num_heads=2, d_ff=64, max_len=16)
LORA = BASE.clone(lora_rank=4, lora_targets=('query', 'value', 'out'))
PROMPT, SEQ, PAIRS = 5, 12, 4


# Jitted once each: eagerly, every op of init/apply compiles on its own for each shape.
_INIT = {model: jax.jit(model.init) for model in (BASE, LORA)}
_APPLY = {model: jax.jit(model.apply) for model in (BASE, LORA)}


def init(model: TransformerLM, seed: int):
  return nn.meta.unbox(_INIT[model](jax.random.key(seed), jnp.zeros((1, SEQ), jnp.int32))['params'])


def pair_batch(seed: int = 0) -> dict[str, jnp.ndarray]:
  """PAIRS pairs as 2 * PAIRS rows: each pair's two rows share PROMPT tokens, then differ;
  completions of different lengths, the rest padding (mask 0)."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, 64, (PAIRS, 2, SEQ + 1))
  tokens[:, 1, :PROMPT] = tokens[:, 0, :PROMPT]
  ends = rng.integers(PROMPT + 2, SEQ + 2, (PAIRS, 2))
  position = np.arange(1, SEQ + 1)  # The target of column c is token c + 1.
  mask = (position >= PROMPT) & (position < ends[..., None])
  flat = lambda x: jnp.asarray(x.reshape(2 * PAIRS, -1))
  return {'inputs': flat(tokens[..., :-1]), 'targets': flat(tokens[..., 1:]),
          'mask': flat(mask.astype(np.float32))}


def lora_params(seed: int = 0, adapters: float = 0.0):
  """LORA's params, its adapters' B scaled from zero (the init) by `adapters`."""
  return _scaled_adapters(init(LORA, seed), jax.random.key(seed + 1), adapters)


@jax.jit
def _scaled_adapters(params, key, adapters):
  flat = traverse_util.flatten_dict(params, sep='/')
  keys = jax.random.split(key, len(flat))
  flat = {k: (adapters * jax.random.normal(key, v.shape) if k.endswith('_lora_b') else v)
          for (k, v), key in zip(flat.items(), keys)}
  return traverse_util.unflatten_dict(flat, sep='/')


def numpy_dpo(policy_logits, ref_logits, batch, beta: float) -> float:
  """The DPO loss in float64 numpy from the two models' logits: log-softmax, the targets'
  log-probs summed over the mask, -log s(beta * ((w - w_ref) - (l - l_ref))), mean over pairs."""
  def seq_logps(logits):
    logits = np.asarray(logits, np.float64)
    top = logits.max(-1, keepdims=True)
    log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_probs, np.asarray(batch['targets'])[..., None], -1)[..., 0]
    return (picked * np.asarray(batch['mask'])).sum(-1).reshape(-1, 2)
  pi, ref = seq_logps(policy_logits), seq_logps(ref_logits)
  delta = (pi[:, 0] - ref[:, 0]) - (pi[:, 1] - ref[:, 1])
  return float(np.mean(np.log1p(np.exp(-beta * delta))))


def test_the_first_dpo_loss_is_log_2_with_zero_margin_and_half_accuracy():
  loss_fn = preference.preference_loss_fn(LORA, PreferenceLoss(beta=0.1))
  value, metrics = jax.jit(loss_fn)(lora_params(), pair_batch(), None)
  assert float(value) == float(np.float32(np.log(2)))  # Exactly: the adapters start at zero.
  assert float(metrics['rewards/margins']) == 0.0
  assert float(metrics['rewards/accuracies']) == 0.5
  assert float(metrics['logps/chosen']) < 0


def test_the_dpo_gradient_is_the_derivative_of_the_numpy_formula():
  beta, batch = 0.5, pair_batch(1)
  params = lora_params(2, adapters=0.3)  # Away from the reference: D != 0 for every pair.
  base_params = preference.without_adapters(params)
  ref_logits = _APPLY[BASE]({'params': base_params}, batch['inputs'])
  loss_fn = preference.preference_loss_fn(LORA, PreferenceLoss(beta=beta))
  # One program for the loss and its gradient.
  value, grads = jax.jit(jax.value_and_grad(lambda p: loss_fn(p, batch, None)[0]))(params)
  flat = traverse_util.flatten_dict(params, sep='/')
  adapters = sorted(k for k in flat if k.endswith(('_lora_a', '_lora_b')))
  rng = np.random.default_rng(3)
  direction = {k: rng.normal(size=flat[k].shape).astype(np.float32) for k in adapters}
  norm = np.sqrt(sum(float((d ** 2).sum()) for d in direction.values()))
  direction = {k: d / norm for k, d in direction.items()}  # A unit step in the adapters.
  flat_grads = traverse_util.flatten_dict(grads, sep='/')
  analytic = sum(float(np.sum(np.asarray(flat_grads[k]) * direction[k])) for k in adapters)

  def numpy_loss(step):
    moved = {k: (v + step * direction[k] if k in direction else v) for k, v in flat.items()}
    moved = traverse_util.unflatten_dict(moved, sep='/')
    return numpy_dpo(_APPLY[LORA]({'params': moved}, batch['inputs']), ref_logits, batch, beta)
  eps = 3e-3
  numeric = (numpy_loss(eps) - numpy_loss(-eps)) / (2 * eps)
  assert abs(analytic) > 1e-2
  assert analytic == pytest.approx(numeric, rel=1e-3)
  assert float(value) == pytest.approx(numpy_loss(0.0), rel=1e-5)


def test_only_completion_targets_are_scored():
  batch = pair_batch()
  logits = _APPLY[LORA]({'params': lora_params(adapters=0.2)}, batch['inputs'])
  sequence_logps = jax.jit(preference.sequence_logps)  # One program for the three calls.
  logps, tokens = sequence_logps(logits, batch)
  np.testing.assert_array_equal(tokens, np.asarray(batch['mask']).sum(-1))
  masked = np.asarray(batch['mask']) == 0
  logits, vocab = np.asarray(logits), np.arange(64.0, dtype=np.float32)
  changed = np.where(masked[..., None], logits + 5 * vocab, logits)
  np.testing.assert_array_equal(sequence_logps(changed, batch)[0], logps)
  at_completion = np.where(~masked[..., None], logits + vocab, logits)
  assert (np.asarray(sequence_logps(at_completion, batch)[0]) != logps).all()


def test_the_adapters_off_reference_is_bitwise_the_base_model():
  batch = pair_batch(4)
  base_params = init(BASE, 7)
  adapted = traverse_util.flatten_dict(lora_params(5, adapters=0.5), sep='/')
  adapted.update(traverse_util.flatten_dict(base_params, sep='/'))  # The base's own weights.
  params = traverse_util.unflatten_dict(adapted, sep='/')
  reference = jax.jit(preference.reference_logps(LORA))(params, batch)
  base_logits = jax.jit(BASE.apply)({'params': base_params}, batch['inputs'])
  np.testing.assert_array_equal(reference, preference.sequence_logps(base_logits, batch)[0])
  policy = preference.sequence_logps(_APPLY[LORA]({'params': params}, batch['inputs']), batch)[0]
  assert (np.asarray(policy) != np.asarray(reference)).all()


def test_reference_free_kinds_tune_a_model_without_adapters():
  for kind in ('simpo', 'orpo'):
    value, metrics = jax.jit(preference.preference_loss_fn(BASE, PreferenceLoss(kind=kind)))(
        init(BASE, 0), pair_batch(), None)
    assert np.isfinite(float(value)) and 'rewards/accuracies' in metrics


def test_a_full_fine_tune_scores_against_its_frozen_copy():
  batch, policy, frozen = pair_batch(6), init(BASE, 1), init(BASE, 2)
  loss_fn = preference.preference_loss_fn(BASE, PreferenceLoss(kind='dpo', beta=0.1))
  value, metrics = jax.jit(loss_fn)(reference.attach(policy), batch, None)
  assert float(value) == float(np.float32(np.log(2)))  # Step 0: the copy is the policy.
  assert float(metrics['rewards/margins']) == 0.0
  assert float(metrics['rewards/accuracies']) == 0.5
  params = {**policy, reference.REFERENCE: frozen}
  ref = jax.jit(preference.reference_logps(BASE))(params, batch)
  frozen_logits = jax.jit(BASE.apply)({'params': frozen}, batch['inputs'])
  np.testing.assert_array_equal(ref, preference.sequence_logps(frozen_logits, batch)[0])
  grads = jax.jit(jax.grad(lambda p: loss_fn(p, batch, None)[0]))(params)
  copy_grads = jax.tree.leaves(grads[reference.REFERENCE])
  assert all(not np.asarray(g).any() for g in copy_grads)  # No gradient through the copy.
  assert any(np.asarray(g).any() for g in jax.tree.leaves(reference.policy(grads)))
  with pytest.raises(ValueError, match='frozen copy'):
    jax.jit(loss_fn)(policy, batch, None)


def test_mismatched_loss_and_data_are_one_line_errors():
  with pytest.raises(UserError, match='train with a preference loss'):
    objectives.task_loss_fn(LORA, None, PreferenceData(files='pairs.jsonl'))
  with pytest.raises(UserError, match='trains on preference pairs'):
    objectives.task_loss_fn(LORA, PreferenceLoss(), LmData())


def test_padding_pairs_are_left_out_of_the_means():
  batch = pair_batch(5)
  padded = {k: jnp.concatenate([v, jnp.zeros((4, SEQ), v.dtype)]) for k, v in batch.items()}
  loss_fn = jax.jit(preference.preference_loss_fn(LORA, PreferenceLoss(beta=0.3)))
  params = lora_params(6, adapters=0.3)
  value, metrics = loss_fn(params, batch, None)
  padded_value, padded_metrics = loss_fn(params, padded, None)
  assert float(padded_value) == pytest.approx(float(value), rel=1e-6)
  # A reward is beta times a difference of sequence log-probs of magnitude up to ~40, whose sums
  # round differently when the batch has other rows: a few float32 ulps of 64, times beta.
  ulps = 0.3 * 4 * float(np.spacing(np.float32(64)))
  for name, v in metrics.items():
    assert float(padded_metrics[name]) == pytest.approx(float(v), rel=1e-6, abs=ulps), name
