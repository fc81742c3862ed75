"""GRPO's objective (Shao et al. 2024, DeepSeekMath) as pure functions, and its settings.

Each prompt gets G sampled completions o_1..o_G with rewards r_1..r_G. A completion's advantage
is its reward minus its group's mean, divided by a std + 1e-4 as TRL's `scale_rewards` says
(std with Bessel's correction, as TRL's torch.std): 'group' (the group's std, the paper's),
'batch' (the std of the whole batch's rewards, PPO Lite) or 'none' (the centring alone, as
Dr. GRPO); the same for each of its tokens. Per completion token t, with the policy's
log-probability l, the sampling policy's l_old and the reference's l_ref:

  ratio = exp(l - l_old)
  J     = min(ratio A, clip(ratio, 1 - epsilon, 1 + epsilon_high) A)   (epsilon_high: DAPO's
          clip-higher; None is epsilon)
  KL    = exp(l_ref - l) - (l_ref - l) - 1        (the k3 estimator, always >= 0)
  loss  = -J + beta KL

averaged as TRL's `loss_type` says, over the step's N completions (the whole generation batch,
in one process: no gradient accumulation):
  'dapo' (default, as TRL) and 'bnpo': the sum over completion tokens / their count (TRL's two
      differ only in normalising per global or per local batch, which are one batch here);
  'grpo' (the paper's): each completion's mean over its tokens, then the mean over completions,
      leaving out empty ones (no completion token) where TRL counts them in N;
  'dr_grpo': the sum over completion tokens / (N * max_completion_length).
The names 'token' and 'sequence' of earlier configs are read as 'dapo' and 'grpo'. With one iteration per batch (`num_iterations` = 1) l_old is l itself with no
gradient: the ratio is 1 and nothing is clipped. Log-probabilities are of logits / temperature,
the distribution the completions were drawn from (top-p's truncation aside), as TRL.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from paxlike.errors import UserError
from paxlike.trainer import rewards

LOSS_TYPES = ('dapo', 'bnpo', 'grpo', 'dr_grpo')
OLD_LOSS_TYPES = {'token': 'dapo', 'sequence': 'grpo'}  # Names saved configs may hold.
SCALINGS = ('group', 'batch', 'none')
STD_EPS = 1e-4  # Added to a group's reward std (TRL's), so a constant group's advantages are 0.


def _number(name: str, value: Any) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    raise UserError(f'loss.{name} must be a finite number, got {value!r}')
  return float(value)


def _positive_int(name: str, value: Any) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise UserError(f'loss.{name} must be a positive integer, got {value!r}')
  return value


@dataclasses.dataclass(frozen=True)
class GrpoLoss:
  """GRPO's settings (see the module docstring). `reward_fns`: callables
  `fn(prompts, completions, **fields) -> list[float]` (paxlike/trainer/rewards.py; a
  'module.function' name on the command line is resolved under the config allow-list), summed
  with `reward_weights` (default 1 each)."""

  reward_fns: tuple[Any, ...] = ()
  reward_weights: tuple[float, ...] | None = None
  num_generations: int = 8          # G: completions per prompt.
  max_completion_length: int = 64   # New tokens per completion at most.
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  beta: float = 0.04                # The KL weight (0: no reference model is run).
  epsilon: float = 0.2              # The ratio's clipping range (below 1; above, as
  epsilon_high: float | None = None  # this unless set: DAPO's clip-higher, e.g. 0.28).
  num_iterations: int = 1           # mu: optimizer updates per sampled batch.
  loss_type: str = 'dapo'           # How tokens are averaged (module docstring).
  scale_rewards: str = 'group'      # What the advantages are divided by: group, batch, none.
  num_completions_to_log: int = 16  # Per logged step to samples.jsonl (grpo_samples; 0: off).

  def __post_init__(self):
    _positive_int('max_completion_length', self.max_completion_length)
    _positive_int('num_iterations', self.num_iterations)
    logged = self.num_completions_to_log
    if isinstance(logged, bool) or not isinstance(logged, int) or logged < 0:
      raise UserError(f'loss.num_completions_to_log must be an integer >= 0 (0: none), got '
                      f'{logged!r}')
    if _positive_int('num_generations', self.num_generations) < 2:
      raise UserError('loss.num_generations must be at least 2: the advantages compare the '
                      'completions of a prompt with each other')
    if not _number('temperature', self.temperature) > 0:
      raise UserError(f'loss.temperature must be > 0 (GRPO samples), got {self.temperature!r}')
    if not 0 < _number('top_p', self.top_p) <= 1:
      raise UserError(f'loss.top_p must be in (0, 1], got {self.top_p!r}')
    if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
      raise UserError(f'loss.top_k must be an integer >= 0 (0: off), got {self.top_k!r}')
    if _number('beta', self.beta) < 0 or not 0 < _number('epsilon', self.epsilon) < 1:
      raise UserError(f'loss.beta must be >= 0 and loss.epsilon in (0, 1), got '
                      f'{self.beta!r}, {self.epsilon!r}')
    if self.epsilon_high is not None and not _number('epsilon_high', self.epsilon_high) > 0:
      raise UserError(f'loss.epsilon_high must be > 0 (None: loss.epsilon), got '
                      f'{self.epsilon_high!r}')
    if isinstance(self.scale_rewards, bool):  # TRL's True and False.
      object.__setattr__(self, 'scale_rewards', 'group' if self.scale_rewards else 'none')
    if self.loss_type in OLD_LOSS_TYPES:
      object.__setattr__(self, 'loss_type', OLD_LOSS_TYPES[self.loss_type])
    if self.loss_type not in LOSS_TYPES or self.scale_rewards not in SCALINGS:
      raise UserError(f'loss.loss_type must be one of {LOSS_TYPES} and loss.scale_rewards one '
                      f'of {SCALINGS}, got {self.loss_type!r}, {self.scale_rewards!r}')
    object.__setattr__(self, 'reward_fns', rewards.checked_fns(self.reward_fns))
    weights = self.reward_weights
    if weights is not None and (not isinstance(weights, (tuple, list)) or
                                len(weights) != len(self.reward_fns)):
      raise UserError(f'loss.reward_weights must give one weight per reward function '
                      f'({len(self.reward_fns)}), got {weights!r}')
    if weights is not None:
      object.__setattr__(self, 'reward_weights',
                         tuple(_number('reward_weights', w) for w in weights))


def group_advantages(rewards: jax.Array, num_generations: int, scale: str = 'group'
                     ) -> jax.Array:
  """float32 [N]: each reward minus its group's mean (groups: G consecutive entries), divided
  by the group's std + STD_EPS under `scale='group'`, by the whole batch's under 'batch'."""
  groups = rewards.astype(jnp.float32).reshape(-1, num_generations)
  centred = groups - jnp.mean(groups, axis=1, keepdims=True)
  if scale == 'group':
    centred = centred / (jnp.std(groups, axis=1, ddof=1, keepdims=True) + STD_EPS)
  elif scale == 'batch':
    centred = centred / (jnp.std(groups, ddof=1) + STD_EPS)
  return centred.reshape(-1)


class TokenTerms(NamedTuple):
  """Float32 [N, T] each, zero where the mask is: the loss per token, its KL term, and 1.0
  where the clipped term was taken (the ratio outside the range on the side that clips)."""

  loss: jax.Array
  kl: jax.Array
  clipped: jax.Array


def token_terms(logps: jax.Array, old_logps: jax.Array, ref_logps: jax.Array | None,
                advantages: jax.Array, mask: jax.Array, epsilon: float, beta: float,
                epsilon_high: float | None = None) -> TokenTerms:
  """The per-token GRPO loss (module docstring) of log-probabilities [N, T] and advantages
  [N]; `ref_logps` None (beta 0) leaves out the KL."""
  a = advantages[:, None]
  ratio = jnp.exp(logps - old_logps)
  low, high = 1.0 - epsilon, 1.0 + (epsilon if epsilon_high is None else epsilon_high)
  objective = jnp.minimum(ratio * a, jnp.clip(ratio, low, high) * a)
  clipped = ((ratio < low) & (a < 0)) | ((ratio > high) & (a > 0))
  if ref_logps is None:
    kl = jnp.zeros_like(logps)
  else:
    delta = ref_logps - logps
    kl = jnp.exp(delta) - delta - 1.0
  mask = mask.astype(jnp.float32)
  return TokenTerms((-objective + beta * kl) * mask, kl * mask, clipped * mask)


def token_weights(mask: jax.Array, loss_type: str, max_completion_length: int = 0
                  ) -> tuple[jax.Array, jax.Array]:
  """(weights [N, T], their normaliser []): a token's share of the loss is weight / normaliser.
  'dapo', 'bnpo': 1 per completion token over their count; 'dr_grpo': 1 per completion token
  over N * max_completion_length; 'grpo': 1/length per token over the number of non-empty
  completions."""
  mask = mask.astype(jnp.float32)
  loss_type = OLD_LOSS_TYPES.get(loss_type, loss_type)
  if loss_type in ('dapo', 'bnpo'):
    return mask, jnp.sum(mask)
  if loss_type == 'dr_grpo':
    if max_completion_length < 1:
      raise ValueError("loss_type='dr_grpo' divides by max_completion_length: give it")
    return mask, jnp.asarray(mask.shape[0] * max_completion_length, jnp.float32)
  lengths = jnp.sum(mask, axis=1, keepdims=True)
  return mask / jnp.maximum(lengths, 1.0), jnp.sum(lengths > 0).astype(jnp.float32)
