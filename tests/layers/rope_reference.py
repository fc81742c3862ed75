"""RoPE inverse frequencies in float64 numpy, written from the published definitions (the
RoPE paper, and the scalings as transformers' `modeling_rope_utils` defines them), apart from
paxlike's code. `seq_len` is a call's longest position + 1, as transformers' dynamic update
computes it (`max(position_ids) + 1`)."""

from __future__ import annotations

import math

import numpy as np


def default(dim: int, base: float) -> np.ndarray:
  """theta_i = base^(-2i / dim), i < dim / 2."""
  return base ** -(np.arange(0, dim, 2) / dim)


def linear(dim: int, base: float, factor: float) -> np.ndarray:
  """Positions divided by `factor`: the frequencies are."""
  return default(dim, base) / factor


def dynamic(dim: int, base: float, factor: float, max_len: int, seq_len: int) -> np.ndarray:
  """Dynamic NTK: past `max_len` the base grows to base·(factor·S/L − (factor − 1))^(d/(d−2)),
  S = max(seq_len, L); up to and at L it is the plain RoPE."""
  s = max(seq_len, max_len)
  grown = base * (factor * s / max_len - (factor - 1)) ** (dim / (dim - 2))
  return default(dim, grown)


def llama3(dim: int, base: float, factor: float, low: float, high: float,
           original: int) -> np.ndarray:
  """Llama 3.1: wavelengths longer than original/low divided by factor, shorter than
  original/high kept, those between blended by s = (original/λ − low) / (high − low):
  (1 − s)·θ/factor + s·θ."""
  theta = default(dim, base)
  out = []
  for t in theta:
    wavelen = 2 * math.pi / t
    if wavelen > original / low:
      out.append(t / factor)
    elif wavelen < original / high:
      out.append(t)
    else:
      s = (original / wavelen - low) / (high - low)
      out.append((1 - s) * t / factor + s * t)
  return np.asarray(out)


def yarn_bounds(dim: int, base: float, original: int, beta_fast: float, beta_slow: float,
                truncate: bool = True) -> tuple[float, float]:
  """The ramp's ends: the feature index that turns `beta` times over `original` positions,
  d·ln(original / (2π·beta)) / (2·ln base), floored (fast) and ceiled (slow) when truncating,
  clipped to [0, dim − 1]."""
  index = lambda beta: dim * math.log(original / (2 * math.pi * beta)) / (2 * math.log(base))
  lo, hi = index(beta_fast), index(beta_slow)
  if truncate:
    lo, hi = math.floor(lo), math.ceil(hi)
  return max(lo, 0), min(hi, dim - 1)


def yarn(dim: int, base: float, factor: float, original: int, beta_fast: float = 32,
         beta_slow: float = 1, truncate: bool = True) -> np.ndarray:
  """YaRN: feature i keeps θ_i below the ramp, takes θ_i / factor above it, and blends them
  linearly on it: ramp(i) = clip((i − lo) / (hi − lo), 0, 1) (hi nudged by 0.001 when equal),
  θ'_i = θ_i / factor · ramp + θ_i · (1 − ramp)."""
  lo, hi = yarn_bounds(dim, base, original, beta_fast, beta_slow, truncate)
  if lo == hi:
    hi += 0.001
  theta = default(dim, base)
  out = []
  for i, t in enumerate(theta):
    ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)
    out.append(t / factor * ramp + t * (1 - ramp))
  return np.asarray(out)


def longrope(dim: int, base: float, short: list[float], long: list[float], original: int,
             seq_len: int) -> np.ndarray:
  """LongRoPE: θ_i / long[i] once seq_len > original, θ_i / short[i] up to and at it."""
  ext = np.asarray(long if seq_len > original else short, np.float64)
  return default(dim, base) / ext


def yarn_attention_factor(factor: float, mscale: float | None = None,
                          mscale_all_dim: float | None = None) -> float:
  """0.1·m·ln(factor) + 1 (1 for factor <= 1); with both mscales their ratio."""
  get = lambda m: 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0
  return get(mscale) / get(mscale_all_dim) if mscale and mscale_all_dim else get(1.0)


def longrope_attention_factor(factor: float, original: int) -> float:
  """sqrt(1 + ln(factor) / ln(original)) (1 for factor <= 1)."""
  return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
