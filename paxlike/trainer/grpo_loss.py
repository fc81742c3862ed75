"""GRPO's objective (Shao et al. 2024, DeepSeekMath) as pure functions, and its settings.

Each prompt gets G sampled completions o_1..o_G with rewards r_1..r_G. A completion's advantage
is its reward normalised within its group, A_i = (r_i - mean(r)) / (std(r) + eps) (std with
Bessel's correction, as TRL's torch.std; `scale_rewards='none'` keeps the centring alone, as
Dr. GRPO), the same for each of its tokens. Per completion token t, with the policy's
log-probability l, the sampling policy's l_old and the reference's l_ref:

  ratio = exp(l - l_old)
  J     = min(ratio A, clip(ratio, 1 - epsilon, 1 + epsilon) A)
  KL    = exp(l_ref - l) - (l_ref - l) - 1        (the k3 estimator, always >= 0)
  loss  = -J + beta KL

averaged over the batch's completion tokens (`loss_type='token'`, TRL's default 'dapo' on one
process) or first over each completion's tokens and then over completions (`'sequence'`, the
paper's). With one iteration per batch (`num_iterations` = 1) l_old is l itself with no
gradient: the ratio is 1 and nothing is clipped. Log-probabilities are of logits / temperature,
the distribution the completions were drawn from (top-p's truncation aside), as TRL.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from paxlike.errors import UserError
from paxlike.trainer import rewards

LOSS_TYPES = ('token', 'sequence')
SCALINGS = ('group', 'none')
STD_EPS = 1e-4  # Added to a group's reward std (TRL's), so a constant group's advantages are 0.


def _number(name: str, value: Any) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise UserError(f'loss.{name} must be a number, got {value!r}')
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
  epsilon: float = 0.2              # The ratio's clipping range.
  num_iterations: int = 1           # mu: optimizer updates per sampled batch.
  loss_type: str = 'token'
  scale_rewards: str = 'group'

  def __post_init__(self):
    _positive_int('max_completion_length', self.max_completion_length)
    _positive_int('num_iterations', self.num_iterations)
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
  by the group's std + STD_EPS under `scale='group'`."""
  groups = rewards.astype(jnp.float32).reshape(-1, num_generations)
  centred = groups - jnp.mean(groups, axis=1, keepdims=True)
  if scale == 'group':
    centred = centred / (jnp.std(groups, axis=1, ddof=1, keepdims=True) + STD_EPS)
  return centred.reshape(-1)


class TokenTerms(NamedTuple):
  """Float32 [N, T] each, zero where the mask is: the loss per token, its KL term, and 1.0
  where the clipped term was taken (the ratio outside the range on the side that clips)."""

  loss: jax.Array
  kl: jax.Array
  clipped: jax.Array


def token_terms(logps: jax.Array, old_logps: jax.Array, ref_logps: jax.Array | None,
                advantages: jax.Array, mask: jax.Array, epsilon: float, beta: float
                ) -> TokenTerms:
  """The per-token GRPO loss (module docstring) of log-probabilities [N, T] and advantages
  [N]; `ref_logps` None (beta 0) leaves out the KL."""
  a = advantages[:, None]
  ratio = jnp.exp(logps - old_logps)
  low, high = 1.0 - epsilon, 1.0 + epsilon
  objective = jnp.minimum(ratio * a, jnp.clip(ratio, low, high) * a)
  clipped = ((ratio < low) & (a < 0)) | ((ratio > high) & (a > 0))
  if ref_logps is None:
    kl = jnp.zeros_like(logps)
  else:
    delta = ref_logps - logps
    kl = jnp.exp(delta) - delta - 1.0
  mask = mask.astype(jnp.float32)
  return TokenTerms((-objective + beta * kl) * mask, kl * mask, clipped * mask)


def token_weights(mask: jax.Array, loss_type: str) -> tuple[jax.Array, jax.Array]:
  """(weights [N, T], their normaliser []): a token's share of the loss is weight / normaliser.
  'token': 1 per completion token over their count; 'sequence': 1/length per token over the
  number of non-empty completions."""
  mask = mask.astype(jnp.float32)
  if loss_type == 'token':
    return mask, jnp.sum(mask)
  lengths = jnp.sum(mask, axis=1, keepdims=True)
  return mask / jnp.maximum(lengths, 1.0), jnp.sum(lengths > 0).astype(jnp.float32)
