"""GRPO on the trainer: the loss (grpo_loss.py's objective as a LossFn of an LM), the scores a
sampled batch needs before its update (advantages, the sampling policy's and the reference's
log-probabilities), and the batch of prompts + completions the update trains on. The trainer
finds them through GRPO's objective record (objectives/grpo.py).

A training batch holds N = B * G sequences (prompt i's G completions in rows i*G .. i*G+G-1):
`inputs`/`targets` int32 [N, T] (prompt + completion, shifted by one; T = data.seq_len +
loss.max_completion_length - 1), `mask` float32 [N, T] on the completion's targets (its stop
token included: it is what ends the completion), `rewards` float32 [N]; `score` adds
`advantages` [N], and `old_logps` [N, T] (num_iterations > 1) and `ref_logps` [N, T] (beta > 0).

The reference model: with LoRA, the base with the adapters off (the same params without the
adapter leaves, as preference.without_adapters; no second copy of the weights). Without LoRA a
run with beta > 0 is refused (one line): it would need a frozen copy of the params, which GRPO
does not keep; beta = 0 (TRL's default) needs no reference and tunes every weight.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from paxlike.core.loss import MaskedMeanLoss
from paxlike.errors import UserError
from paxlike.layers.lora import LoraSpec
from paxlike.trainer import losses, preference
from paxlike.trainer.grpo_loss import GrpoLoss, group_advantages, token_terms, token_weights

# Per-step metrics (means over the steps since the last row, as the loss): the GRPO loss's own
# and what the step's host side measures of the samples.
LOSS_METRICS = ('kl', 'clip_ratio')
SAMPLE_METRICS = ('reward', 'reward_std', 'reward_max', 'completion_length')
METRICS = (*LOSS_METRICS, *SAMPLE_METRICS)


def check_task(model: nn.Module, loss: GrpoLoss, data: Any) -> None:
  """UserError when GRPO's parts disagree: a KL term without LoRA (no reference), or a prompt
  plus completion past the model's context."""
  if loss.beta > 0 and not LoraSpec.of(model).enabled:
    raise UserError('GRPO with loss.beta > 0 keeps the policy near a reference model, the base '
                    'with the LoRA adapters off: set model.lora_rank > 0, or loss.beta=0 to '
                    'tune every weight without a reference')
  if data is not None and not model.rope:
    needed = data.seq_len + loss.max_completion_length - 1
    if needed > model.max_len:
      raise UserError(f'a prompt of data.seq_len={data.seq_len} tokens plus '
                      f'loss.max_completion_length={loss.max_completion_length} takes {needed} '
                      f'positions, past model.max_len={model.max_len}')


def token_logps(model: nn.Module, params: Any, batch: losses.Batch, temperature: float,
                rng: jax.Array | None = None) -> jax.Array:
  """float32 [N, T]: each target's log-probability under logits / temperature."""
  rngs = {} if rng is None else {'dropout': rng}
  logits = model.apply({'params': params}, batch['inputs'], deterministic=rng is None,
                       rngs=rngs, **losses.model_inputs(batch))
  per_target, _ = losses.per_example_loss(logits.astype(jnp.float32) / temperature, batch)
  return -per_target


def grpo_loss_fn(model: nn.Module, loss: GrpoLoss) -> MaskedMeanLoss:
  """The LossFn of `loss` on scored training batches (module docstring), kept as sums over the
  weighted completion tokens (grpo_loss.token_weights) with metrics `kl` and `clip_ratio`."""

  def sums(params, batch, rng):
    logps = token_logps(model, params, batch, loss.temperature, rng)
    old = batch['old_logps'] if loss.num_iterations > 1 else jax.lax.stop_gradient(logps)
    terms = token_terms(logps, old, batch.get('ref_logps'), batch['advantages'], batch['mask'],
                        loss.epsilon, loss.beta, loss.epsilon_high)
    weights, count = token_weights(batch['mask'], loss.loss_type, loss.max_completion_length)
    return (jnp.sum(terms.loss * weights),
            (count, {'kl': jnp.sum(terms.kl * weights),
                     'clip_ratio': jnp.sum(terms.clipped * weights)}))
  return MaskedMeanLoss(sums)


def scorer(model: nn.Module, loss: GrpoLoss) -> Callable[[Any, dict], dict]:
  """`score(params, batch) -> batch` with `advantages` (from `rewards`) and, as the loss needs
  them, `old_logps` (the params that sampled) and `ref_logps` (the base, adapters off); no
  gradient. Batches lead [1, 1, N, ...] as a round's."""
  spec = LoraSpec.of(model)
  base = spec.base(model) if spec.enabled else None

  def score(params, batch):
    flat = jax.tree.map(lambda x: x[0, 0], batch)
    out = {'advantages': group_advantages(flat['rewards'], loss.num_generations,
                                          loss.scale_rewards)}
    if loss.num_iterations > 1:
      out['old_logps'] = token_logps(model, params, flat, loss.temperature)
    if loss.beta > 0:
      base_params = preference.without_adapters(params)
      out['ref_logps'] = token_logps(base, base_params, flat, loss.temperature)
    out = jax.tree.map(lambda x: jax.lax.stop_gradient(x)[None, None], out)
    return {**batch, **out}
  return score


def train_batch(prompts: list[np.ndarray], completions: list[np.ndarray], width: int,
                pad_id: int) -> dict[str, np.ndarray]:
  """`inputs`, `targets`, `mask` [N, width] of prompt i + completion i (each cut to fit; the
  mask on the completion's targets)."""
  n = len(prompts)
  inputs = np.full((n, width), pad_id, np.int32)
  targets, mask = inputs.copy(), np.zeros((n, width), np.float32)
  for i, (prompt, completion) in enumerate(zip(prompts, completions)):
    tokens = np.concatenate([prompt, completion]).astype(np.int32)[:width + 1]
    inputs[i, :len(tokens) - 1], targets[i, :len(tokens) - 1] = tokens[:-1], tokens[1:]
    mask[i, len(prompt) - 1:len(tokens) - 1] = 1.0
  return {'inputs': inputs, 'targets': targets, 'mask': mask}


def repeated(algorithm: Any, times: int) -> Any:
  """`algorithm` taking `times` updates on each round's batches (GRPO's num_iterations), its
  metrics the mean over them (the learning rate: the last's)."""
  if times == 1:
    return algorithm

  def next_(state, batches, weights, rng):
    step = lambda s, key: algorithm.next(s, batches, weights, key)
    state, metrics = jax.lax.scan(step, state, jax.random.split(rng, times))
    last = lambda k, v: v[-1] if k == 'learning_rate' else jnp.mean(v, axis=0)
    return state, {k: None if v is None else last(k, v) for k, v in metrics.items()}
  return algorithm._replace(next=next_, over_trainable=None)
