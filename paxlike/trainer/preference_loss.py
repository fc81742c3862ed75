"""Preference losses over sequence log-probabilities: DPO and its variants, as pure functions.

A pair is a prompt x with a chosen completion y_w and a rejected one y_l; its inputs are the
policy's log-probabilities log pi(y|x), summed over the completion's tokens (never the prompt's),
the completions' token counts, and for the losses that have one the reference model's
log-probabilities. With the log-ratios h_w = log pi(y_w|x) - log pi_ref(y_w|x) and h_l alike:

  dpo    Rafailov et al. 2023:  -log s(beta (h_w - h_l)); with `label_smoothing` e > 0 the
         conservative DPO of Mitchell 2023: -(1 - e) log s(beta D) - e log s(-beta D).
  ipo    Azar et al. 2023, eq. 17:  (D - 1 / (2 beta))^2, where with `ipo_average` (the default,
         as TRL) each log-ratio is divided by its completion's tokens first, else summed (the
         paper's form).
  simpo  Meng et al. 2024, reference-free:  -log s(beta (a_w - a_l) - gamma), a = log pi / tokens
         (label_smoothing applies as in dpo).
  orpo   Hong et al. 2024, reference-free:  -a_w - beta log s(log odds(y_w) - log odds(y_l)),
         odds(y) = P / (1 - P) with P = exp(a): the chosen completion's per-token NLL plus the
         odds-ratio term weighted by beta (the paper's lambda), per pair.

s is the logistic sigmoid. Implicit rewards (TRL's): beta * h for dpo and ipo, beta * a for simpo
and orpo. A pair counts as ranked right when its chosen reward is the larger; a tie (every pair at
step 0 of dpo, where the reference is the policy) counts one half, so the reward accuracy of a
model that cannot tell the two apart is 0.5 (TRL counts ties as wrong and reports 0.0).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from paxlike.errors import UserError

KINDS = ('dpo', 'ipo', 'simpo', 'orpo')
REFERENCE_FREE = ('simpo', 'orpo')  # The kinds that need no reference model.
# Per-pair metrics, named as TRL logs them (means over the batch's pairs).
METRICS = ('rewards/chosen', 'rewards/rejected', 'rewards/margins', 'rewards/accuracies',
           'logps/chosen', 'logps/rejected')


@dataclasses.dataclass(frozen=True)
class PreferenceLoss:
  """Which preference loss trains the pairs, and its constants (see the module docstring).
  `beta`: the KL weight (dpo), the regulariser tau (ipo), the reward scale (simpo), the
  odds-ratio weight lambda (orpo)."""

  kind: str = 'dpo'
  beta: float = 0.1
  label_smoothing: float = 0.0  # dpo, simpo: the share of pairs assumed flipped, in [0, 0.5).
  gamma: float = 0.5  # simpo: the target reward margin.
  ipo_average: bool = True  # ipo: log-ratios per completion token (TRL), else summed (paper).

  def __post_init__(self):
    if self.kind not in KINDS:
      raise UserError(f'loss.kind must be one of {", ".join(KINDS)}, got {self.kind!r}')
    for name in ('beta', 'label_smoothing', 'gamma'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
          value):
        raise UserError(f'loss.{name} must be a finite number, got {value!r}')
    if not self.beta > 0:
      raise UserError(f'loss.beta must be > 0, got {self.beta!r}')
    if not 0 <= self.label_smoothing < 0.5:
      raise UserError(f'loss.label_smoothing must be in [0, 0.5), got {self.label_smoothing!r}')
    if self.label_smoothing and self.kind not in ('dpo', 'simpo'):
      raise UserError(f"loss.label_smoothing applies to kind 'dpo' and 'simpo', not "
                      f'{self.kind!r}')
    if self.kind == 'simpo' and self.gamma < 0:
      raise UserError(f'loss.gamma is the target reward margin of simpo and must be >= 0, got '
                      f'{self.gamma!r}')
    if not isinstance(self.ipo_average, bool):
      raise UserError(f'loss.ipo_average must be True or False, got {self.ipo_average!r}')

  @property
  def needs_reference(self) -> bool:
    """Whether the loss compares the policy with a reference model."""
    return self.kind not in REFERENCE_FREE


class PairLogps(NamedTuple):
  """Float32 [pairs] each: summed completion log-probabilities and completion token counts;
  the reference's are None for the reference-free kinds."""

  chosen: jax.Array
  rejected: jax.Array
  chosen_tokens: jax.Array
  rejected_tokens: jax.Array
  ref_chosen: jax.Array | None = None
  ref_rejected: jax.Array | None = None


def per_token(logps: jax.Array, tokens: jax.Array) -> jax.Array:
  """`logps / tokens`, and -1 where a completion has no tokens (an empty padding pair), so that
  no loss or gradient of such a pair is ever NaN."""
  return jnp.where(tokens > 0, logps / jnp.maximum(tokens, 1.0), -1.0)


def log1mexp(x: jax.Array) -> jax.Array:
  """log(1 - exp(x)) for x < 0 (x is clipped below 0), stable at both ends."""
  x = jnp.minimum(x, -1e-7)
  return jnp.where(x > -0.6931472, jnp.log(-jnp.expm1(x)), jnp.log1p(-jnp.exp(x)))


def _smoothed(z: jax.Array, smoothing: float) -> jax.Array:
  """-(1 - e) log s(z) - e log s(-z)."""
  return -(1 - smoothing) * jax.nn.log_sigmoid(z) - smoothing * jax.nn.log_sigmoid(-z)


def pair_losses(loss: PreferenceLoss, p: PairLogps
                ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(loss, chosen reward, rejected reward), each float32 [pairs]; the rewards carry no
  gradient."""
  if loss.needs_reference:
    if p.ref_chosen is None or p.ref_rejected is None:
      raise ValueError(f'loss.kind={loss.kind!r} needs the reference log-probabilities')
    h_w, h_l = p.chosen - p.ref_chosen, p.rejected - p.ref_rejected
    reward_w, reward_l = loss.beta * h_w, loss.beta * h_l
    if loss.kind == 'dpo':
      value = _smoothed(loss.beta * (h_w - h_l), loss.label_smoothing)
    else:  # ipo
      if loss.ipo_average:
        h_w, h_l = per_token(h_w, p.chosen_tokens), per_token(h_l, p.rejected_tokens)
      value = (h_w - h_l - 1 / (2 * loss.beta)) ** 2
  else:
    a_w, a_l = per_token(p.chosen, p.chosen_tokens), per_token(p.rejected, p.rejected_tokens)
    reward_w, reward_l = loss.beta * a_w, loss.beta * a_l
    if loss.kind == 'simpo':
      value = _smoothed(loss.beta * (a_w - a_l) - loss.gamma, loss.label_smoothing)
    else:  # orpo
      log_odds = (a_w - a_l) - (log1mexp(a_w) - log1mexp(a_l))
      value = -a_w - loss.beta * jax.nn.log_sigmoid(log_odds)
  return value, jax.lax.stop_gradient(reward_w), jax.lax.stop_gradient(reward_l)


def pair_metrics(reward_w: jax.Array, reward_l: jax.Array, p: PairLogps) -> dict[str, jax.Array]:
  """The per-pair values of METRICS (float32 [pairs] each)."""
  accuracy = jnp.where(reward_w > reward_l, 1.0, jnp.where(reward_w == reward_l, 0.5, 0.0))
  return {'rewards/chosen': reward_w, 'rewards/rejected': reward_l,
          'rewards/margins': reward_w - reward_l, 'rewards/accuracies': accuracy,
          'logps/chosen': jax.lax.stop_gradient(p.chosen),
          'logps/rejected': jax.lax.stop_gradient(p.rejected)}
