"""Rotary position embeddings (rotate-half layout) and the context-extension scalings of
Hugging Face's `modeling_rope_utils`: 'linear', 'dynamic' (NTK), 'yarn', 'llama3', 'longrope'.

A head of H features pairs feature i with i + H/2 and turns each pair by position · inv_freq[i],
inv_freq[i] = base^(-2i/H) unscaled. The scalings change inv_freq (and yarn/longrope scale cos
and sin by an attention factor):
- linear: inv_freq / factor.
- dynamic: the base grows once a call's longest position S = max(positions) + 1 passes
  `original_max_len` L: base · (factor · S / L − (factor − 1))^(H / (H − 2)).
- yarn: a per-feature blend of inv_freq and inv_freq / factor by a linear ramp between the
  features that turn `beta_fast` and `beta_slow` times over L; cos/sin × attention_factor.
- llama3: wavelengths over L / low_freq_factor are divided by factor, under L / high_freq_factor
  kept, and those between smoothly interpolated.
- longrope: inv_freq / short_factor[i] (long_factor[i] once S > L); cos/sin × attention_factor.
The frequencies are float32, as transformers computes them.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

KINDS = ('linear', 'dynamic', 'yarn', 'llama3', 'longrope')


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """One RoPE scaling (hashable, Fiddle-serialisable): `kind` in KINDS and its settings.
  `original_max_len` is L above (dynamic: the config's max_position_embeddings);
  `attention_factor` is resolved (yarn's and longrope's defaults computed) when read."""

  kind: str
  factor: float = 1.0
  original_max_len: int = 0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  attention_factor: float = 1.0
  truncate: bool = True
  short_factor: tuple[float, ...] = ()
  long_factor: tuple[float, ...] = ()

  def __post_init__(self) -> None:
    if self.kind not in KINDS:
      raise ValueError(f'rope_scaling kind must be one of {", ".join(KINDS)}, got {self.kind!r}')
    if self.kind != 'linear' and self.original_max_len < 1:
      raise ValueError(f'rope_scaling {self.kind!r} needs original_max_len >= 1')


def _exponents(head_dim: int) -> np.ndarray:
  return np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)


def _llama3(inv_freq: np.ndarray, s: RopeScaling) -> np.ndarray:
  wavelen = 2 * math.pi / inv_freq
  low_wavelen = s.original_max_len / s.low_freq_factor
  high_wavelen = s.original_max_len / s.high_freq_factor
  scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
  smooth = (s.original_max_len / wavelen - s.low_freq_factor) / (
      s.high_freq_factor - s.low_freq_factor)
  smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
  medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def _yarn(head_dim: int, base: float, s: RopeScaling) -> np.ndarray:
  def correction_dim(rotations: float) -> float:
    return head_dim * math.log(s.original_max_len / (rotations * 2 * math.pi)) / (
        2 * math.log(base))
  low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
  if s.truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, head_dim - 1)
  high = high + 0.001 if low == high else high
  ramp = np.clip((np.arange(head_dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
  extrapolate = (1 - ramp).astype(np.float32)
  pos_freqs = np.float32(base) ** _exponents(head_dim)
  return ((1 / (s.factor * pos_freqs)) * (1 - extrapolate)
          + (1 / pos_freqs) * extrapolate).astype(np.float32)


def static_frequencies(head_dim: int, base: float, scaling: RopeScaling | None) -> np.ndarray:
  """inv_freq float32 [H/2] for scalings that do not depend on the sequence length."""
  inv_freq = (1.0 / np.float32(base) ** _exponents(head_dim)).astype(np.float32)
  if scaling is None:
    return inv_freq
  if scaling.kind == 'linear':
    return (inv_freq / np.float32(scaling.factor)).astype(np.float32)
  if scaling.kind == 'llama3':
    return _llama3(inv_freq, scaling)
  if scaling.kind == 'yarn':
    return _yarn(head_dim, base, scaling)
  raise ValueError(f'rope scaling {scaling.kind!r} depends on the sequence length')


def frequencies(head_dim: int, base: float, scaling: RopeScaling | None,
                positions: jax.Array) -> jax.Array:
  """inv_freq float32 [H/2] for a call at `positions` (dynamic and longrope read their
  longest position, over the whole batch, as transformers does)."""
  kind = scaling.kind if scaling else None
  if kind not in ('dynamic', 'longrope'):
    return jnp.asarray(static_frequencies(head_dim, base, scaling))
  longest = jnp.max(positions).astype(jnp.float32) + 1
  length = np.float32(scaling.original_max_len)
  exponents = jnp.asarray(_exponents(head_dim))
  if kind == 'dynamic':
    grown = jnp.maximum(longest, length)
    new_base = base * (scaling.factor * grown / length - (scaling.factor - 1)) ** (
        head_dim / (head_dim - 2))
    return 1.0 / new_base ** exponents
  ext = jnp.where(longest > length, jnp.asarray(scaling.long_factor, jnp.float32),
                  jnp.asarray(scaling.short_factor, jnp.float32))
  return 1.0 / (ext * jnp.float32(base) ** exponents)


def tables(positions: jax.Array, head_dim: int, base: float,
           scaling: RopeScaling | None) -> tuple[jax.Array, jax.Array]:
  """(cos, sin) float32 [(B,) T, 1, H/2] for `positions` [T] or [B, T], times the scaling's
  attention factor."""
  inv_freq = frequencies(head_dim, base, scaling, positions)
  angles = positions.astype(jnp.float32)[..., None] * inv_freq
  factor = scaling.attention_factor if scaling else 1.0
  return (jnp.cos(angles)[..., None, :] * factor, jnp.sin(angles)[..., None, :] * factor)


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """x [B, T, N, H] turned by the tables, in float32, cast back to x.dtype."""
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def apply_rope(x: jax.Array, positions: jax.Array, base: float = 10_000.0,
               scaling: RopeScaling | None = None) -> jax.Array:
  """x [B, T, N, H] rotated at `positions` ([T] shared by the batch, or [B, T])."""
  return rotate(x, *tables(positions, x.shape[-1], base, scaling))
