"""Float64 numpy reference for the mixture-of-experts feed-forward blocks of Mixtral, Qwen2-MoE and
Qwen3-MoE, written from their published descriptions (token by token, no capacity, nothing
dropped) and kept apart from paxlike's JAX code.

Weights are in the Hugging Face layout: a linear map `W` is [out, in] and computes x @ W.T.
- router ("gate"): [E, d]. p = softmax(x W_g.T) over all E experts; the k largest p are the
  token's experts; their weights are p renormalised to sum to 1 when `norm_topk` (Mixtral always,
  Qwen-MoE when `norm_topk_prob`), the raw p otherwise.
- expert e: SwiGLU, down(silu(gate(x)) * up(x)), gate/up [f, d], down [d, f]
  (Mixtral's w1, w3, w2).
- Qwen2-MoE's shared expert: a SwiGLU of its own width every token runs, scaled by
  sigmoid(x W_s.T) with W_s [1, d], added to the experts' sum.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np


class Swiglu(NamedTuple):
  """One gated MLP in the HF layout: gate, up [f, d]; down [d, f]."""

  gate: np.ndarray
  up: np.ndarray
  down: np.ndarray


class SparseMoe(NamedTuple):
  """A MoE block: router [E, d], one Swiglu per expert, and optionally Qwen2-MoE's shared expert
  with its gate [1, d]."""

  router: np.ndarray
  experts: Sequence[Swiglu]
  shared: Swiglu | None = None
  shared_gate: np.ndarray | None = None


def softmax(z: np.ndarray) -> np.ndarray:
  z = z - z.max(axis=-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(axis=-1, keepdims=True)


def silu(x: np.ndarray) -> np.ndarray:
  return x / (1.0 + np.exp(-x))


def swiglu(x: np.ndarray, w: Swiglu) -> np.ndarray:
  """down(silu(gate(x)) * up(x)) for x [..., d]."""
  x = np.asarray(x, np.float64)
  return (silu(x @ w.gate.T) * (x @ w.up.T)) @ w.down.T


def top_k_weights(probs: np.ndarray, k: int, norm_topk: bool) -> list[list[tuple[int, float]]]:
  """Per token (rows of probs [N, E]): its k experts, largest first, with their weights."""
  picks = []
  for row in probs:
    top = np.argsort(-row, kind='stable')[:k]
    weights = row[top] / row[top].sum() if norm_topk else row[top]
    picks.append(list(zip(top.tolist(), weights.tolist())))
  return picks


def sparse_moe(x: np.ndarray, block: SparseMoe, k: int, norm_topk: bool) -> np.ndarray:
  """The block on x [..., d] (float64), every token through its k experts."""
  x = np.asarray(x, np.float64)
  flat = x.reshape(-1, x.shape[-1])
  probs = softmax(flat @ block.router.T)
  out = np.zeros_like(flat)
  for t, picks in enumerate(top_k_weights(probs, k, norm_topk)):
    for expert, weight in picks:
      out[t] += weight * swiglu(flat[t], block.experts[expert])
  if block.shared is not None:
    scale = 1.0 / (1.0 + np.exp(-(flat @ block.shared_gate.T)))
    out += scale * swiglu(flat, block.shared)
  return out.reshape(x.shape)


def random_block(rng: np.random.Generator, d: int, f: int, num_experts: int,
                 shared_f: int = 0, scale: float = 0.3) -> SparseMoe:
  """A block of random float32-representable weights (HF layout)."""
  w = lambda *shape: rng.normal(0.0, scale, shape).astype(np.float32).astype(np.float64)
  mlp = lambda width: Swiglu(w(width, d), w(width, d), w(d, width))
  experts = [mlp(f) for _ in range(num_experts)]
  if not shared_f:
    return SparseMoe(w(num_experts, d) * 3, experts)
  return SparseMoe(w(num_experts, d) * 3, experts, mlp(shared_f), w(1, d))
