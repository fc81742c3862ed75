"""Sampling text from a byte-level LM (`--mode=decode`)."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from paxlike.errors import UserError


def encode(text: str) -> np.ndarray:
  return np.frombuffer(text.encode('utf-8'), np.uint8).astype(np.int32)


def decode_bytes(tokens: np.ndarray) -> str:
  return bytes(np.asarray(tokens, np.uint8).tolist()).decode('utf-8', errors='replace')


@functools.partial(jax.jit, static_argnums=(0,))
def _next_token(model: nn.Module, params, window: jax.Array, length: jax.Array,
                temperature: jax.Array, rng: jax.Array) -> jax.Array:
  """Samples the token after `window[:length]` (window is a fixed-size, left-aligned buffer)."""
  logits = model.apply({'params': params}, window[None], deterministic=True)[0, length - 1]
  greedy = jnp.argmax(logits)
  sampled = jax.random.categorical(rng, logits / jnp.maximum(temperature, 1e-6))
  return jnp.where(temperature > 0, sampled, greedy)


def sample_tokens(model: nn.Module, params, prompt: np.ndarray, steps: int, temperature: float,
                  seed: int) -> np.ndarray:
  """`steps` new tokens after `prompt`, seeing at most `model.max_len` tokens of context."""
  context = getattr(model, 'max_len', 256)
  tokens = list(prompt)
  rng = jax.random.key(seed)
  for i in range(steps):
    visible = tokens[-context:]
    window = np.zeros(context, np.int32)
    window[:len(visible)] = visible
    token = _next_token(model, params, jnp.asarray(window), jnp.int32(len(visible)),
                        jnp.float32(temperature), jax.random.fold_in(rng, i))
    tokens.append(int(token))
  return np.asarray(tokens[len(prompt):], np.int32)


def sample_text(model: nn.Module, params, prompt: str, steps: int, temperature: float,
                seed: int) -> str:
  """The prompt followed by `steps` sampled bytes."""
  if not prompt:
    raise UserError('--prompt must not be empty')
  if steps <= 0 or temperature < 0:
    raise UserError('--decode_length must be positive and --temperature non-negative')
  if getattr(model, 'vocab_size', None) != 256:
    raise UserError('--mode=decode needs a byte-level LM experiment (vocab_size 256)')
  return prompt + decode_bytes(sample_tokens(model, params, encode(prompt), steps, temperature, seed))
