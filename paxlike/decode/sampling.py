"""Choosing the next token from logits: pure functions of (rng, logits) and static options.

Greedy when the temperature is 0; otherwise the logits are divided by the temperature, then
top-k keeps the k largest (ties with the k-th kept), then top-p (nucleus) keeps the fewest
most likely tokens whose probability reaches p (the most likely is always kept), and
`jax.random.categorical` draws from what is left.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from paxlike.errors import UserError


@dataclasses.dataclass(frozen=True)
class Sampling:
  """How to pick each token: `temperature` 0 is greedy; `top_k` 0 and `top_p` 1 are off."""

  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if self.temperature < 0:
      raise UserError(f'temperature must be >= 0, got {self.temperature}')
    if self.top_k < 0:
      raise UserError(f'top_k must be >= 0 (0 = off), got {self.top_k}')
    if not 0 < self.top_p <= 1:
      raise UserError(f'top_p must be in (0, 1], got {self.top_p}')


def top_k_filter(logits: jax.Array, k: int) -> jax.Array:
  """`logits` [..., V] with every entry below the k-th largest of its row set to -inf."""
  if k <= 0 or k >= logits.shape[-1]:
    return logits
  kth = jax.lax.top_k(logits, k)[0][..., -1:]
  return jnp.where(logits < kth, -jnp.inf, logits)


def top_p_filter(logits: jax.Array, p: float) -> jax.Array:
  """`logits` [..., V] keeping, per row, the most likely tokens until their probability
  reaches `p`: a token stays when the mass of the tokens more likely than it is below p."""
  if p >= 1:
    return logits
  ordered = jnp.flip(jnp.sort(logits, axis=-1), axis=-1)
  probs = jax.nn.softmax(ordered, axis=-1)
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  threshold = jnp.min(jnp.where(mass_before < p, ordered, jnp.inf), axis=-1, keepdims=True)
  return jnp.where(logits < threshold, -jnp.inf, logits)


def sample(rng: jax.Array, logits: jax.Array, sampling: Sampling) -> jax.Array:
  """int32 tokens [...] drawn from `logits` [..., V] as `sampling` says."""
  if sampling.temperature == 0:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = logits.astype(jnp.float32) / sampling.temperature
  logits = top_p_filter(top_k_filter(logits, sampling.top_k), sampling.top_p)
  return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)
