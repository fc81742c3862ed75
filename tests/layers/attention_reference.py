"""Causal self-attention in float64 numpy from its published description (Llama / Gemma /
Qwen 3 as transformers writes them), apart from paxlike's code: projections, optional
per-head RMS q/k-norm before rotate-half RoPE, grouped-query heads, scores times a scale,
soft-capped (cap·tanh(s/cap)) and then masked (causal, optional sliding window: query i sees
keys i − W < j <= i), softmax, output projection."""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, offset: float = 0.0) -> np.ndarray:
  """x / sqrt(mean(x²) + eps) · (offset + weight) over the last axis."""
  return x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + eps) * (offset + weight)


def rotate(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray,
           attention_factor: float = 1.0) -> np.ndarray:
  """x [B, T, N, H] turned by rotate-half RoPE: feature i pairs with i + H/2, angle p·θ_i;
  cos and sin times `attention_factor`."""
  angles = positions[:, None] * inv_freq[None]  # [T, H/2]
  cos = np.cos(angles)[None, :, None] * attention_factor
  sin = np.sin(angles)[None, :, None] * attention_factor
  x1, x2 = np.split(x, 2, axis=-1)
  return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def allowed(q_positions: np.ndarray, k_positions: np.ndarray, window: int | None) -> np.ndarray:
  """bool [T, S]: causal, and within the window when given."""
  rel = q_positions[:, None] - k_positions[None, :]
  return (rel >= 0) & (True if window is None else rel < window)


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float,
           softcap: float | None) -> np.ndarray:
  """q [B, T, N, H], k and v [B, S, K, H] (N a multiple of K), mask [T, S] -> [B, T, N, H]:
  soft-cap first, then the mask (a masked score is excluded, not capped)."""
  groups = q.shape[2] // k.shape[2]
  k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
  scores = np.einsum('btnh,bsnh->bnts', q, k) * scale
  if softcap is not None:
    scores = softcap * np.tanh(scores / softcap)
  scores = np.where(mask[None, None], scores, -np.inf)
  weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
  weights /= weights.sum(axis=-1, keepdims=True)
  return np.einsum('bnts,bsnh->btnh', weights, v)


def self_attention(x: np.ndarray, p: dict, positions: np.ndarray, inv_freq: np.ndarray, *,
                   window: int | None = None, scale: float | None = None,
                   softcap: float | None = None, qk_norm_eps: float | None = None,
                   norm_offset: float = 0.0, attention_factor: float = 1.0,
                   norm_after_rope: bool = False) -> np.ndarray:
  """One layer's attention of x [B, T, d] with paxlike-layout params `p` (query [d, N, H],
  key/value [d, K, H], out [N, H, d], query_norm/key_norm {'scale'}); `norm_after_rope`
  computes the wrong order, to show a test tells them apart."""
  f = lambda name: np.asarray(p[name], np.float64)
  q = np.einsum('btd,dnh->btnh', x, f('query'))
  k = np.einsum('btd,dnh->btnh', x, f('key'))
  v = np.einsum('btd,dnh->btnh', x, f('value'))
  norm = lambda y, name: rms_norm(y, np.asarray(p[name]['scale'], np.float64), qk_norm_eps,
                                  norm_offset)
  if qk_norm_eps is not None and not norm_after_rope:
    q, k = norm(q, 'query_norm'), norm(k, 'key_norm')
  q = rotate(q, positions, inv_freq, attention_factor)
  k = rotate(k, positions, inv_freq, attention_factor)
  if qk_norm_eps is not None and norm_after_rope:
    q, k = norm(q, 'query_norm'), norm(k, 'key_norm')
  h = q.shape[-1]
  out = attend(q, k, v, allowed(positions, positions, window), h**-0.5 if scale is None else scale,
               softcap)
  return np.einsum('btnh,nhd->btd', out, f('out'))
