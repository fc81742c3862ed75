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


# The whole model: Mixtral, Qwen2-MoE and Qwen3-MoE decoders (default RoPE only) on HF tensors.

def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
  return x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + eps) * weight


def rope_theta(cfg: dict) -> float:
  """The RoPE base in either config layout (transformers 5's rope_parameters, or top level)."""
  return float((cfg.get('rope_parameters') or {}).get('rope_theta') or cfg['rope_theta'])


def attention(x: np.ndarray, t: dict, p: str, cfg: dict) -> np.ndarray:
  """Causal GQA self-attention of layer prefix `p` (HF rotate-half RoPE, repeat_kv), with the
  optional q/k/v(/o) biases (Qwen2-MoE; Qwen3-MoE's attention_bias), per-head q/k RMSNorm
  (Qwen3-MoE) and sliding window."""
  n, kv, d = cfg['num_attention_heads'], cfg['num_key_value_heads'], cfg['hidden_size']
  h, length = cfg.get('head_dim') or d // n, x.shape[1]
  proj = lambda name, heads: (x @ t[f'{p}self_attn.{name}.weight'].T
                              + t.get(f'{p}self_attn.{name}.bias', 0.0)).reshape(
                                  *x.shape[:2], heads, h)
  q, k, v = proj('q_proj', n), proj('k_proj', kv), proj('v_proj', kv)
  if f'{p}self_attn.q_norm.weight' in t:
    q = rms_norm(q, t[f'{p}self_attn.q_norm.weight'], cfg['rms_norm_eps'])
    k = rms_norm(k, t[f'{p}self_attn.k_norm.weight'], cfg['rms_norm_eps'])
  inv_freq = 1.0 / rope_theta(cfg) ** (np.arange(0, h, 2) / h)
  angles = np.concatenate([np.outer(np.arange(length), inv_freq)] * 2, axis=-1)[:, None, :]
  rotate_half = lambda y: np.concatenate([-y[..., h // 2:], y[..., :h // 2]], axis=-1)
  rope = lambda y: y * np.cos(angles) + rotate_half(y) * np.sin(angles)
  q, k = rope(q), rope(k)
  k, v = np.repeat(k, n // kv, axis=2), np.repeat(v, n // kv, axis=2)
  scores = np.einsum('bqnh,bknh->bnqk', q, k) / np.sqrt(h)
  query, key = np.arange(length)[:, None], np.arange(length)[None, :]
  visible = key <= query
  if cfg.get('sliding_window'):
    visible &= query - key < cfg['sliding_window']
  probs = softmax(np.where(visible, scores, -np.inf))
  out = np.einsum('bnqk,bknh->bqnh', probs, v).reshape(*x.shape[:2], n * h)
  return out @ t[f'{p}self_attn.o_proj.weight'].T + t.get(f'{p}self_attn.o_proj.bias', 0.0)


def layer_moe(t: dict, p: str, cfg: dict) -> SparseMoe:
  """Layer `p`'s MoE block from per-expert HF tensors (Mixtral's or Qwen-MoE's names)."""
  if cfg['model_type'] == 'mixtral':
    expert = lambda e: Swiglu(*(t[f'{p}block_sparse_moe.experts.{e}.{w}.weight']
                                for w in ('w1', 'w3', 'w2')))
    experts = [expert(e) for e in range(cfg['num_local_experts'])]
    return SparseMoe(t[f'{p}block_sparse_moe.gate.weight'], experts)
  mlp = lambda q: Swiglu(*(t[f'{q}{w}.weight'] for w in ('gate_proj', 'up_proj', 'down_proj')))
  experts = [mlp(f'{p}mlp.experts.{e}.') for e in range(cfg['num_experts'])]
  if f'{p}mlp.shared_expert.gate_proj.weight' not in t:
    return SparseMoe(t[f'{p}mlp.gate.weight'], experts)
  return SparseMoe(t[f'{p}mlp.gate.weight'], experts, mlp(f'{p}mlp.shared_expert.'),
                   t[f'{p}mlp.shared_expert_gate.weight'])


def moe_logits(t: dict[str, np.ndarray], cfg: dict, tokens: np.ndarray) -> np.ndarray:
  """Float64 logits [B, T, vocab] of a Mixtral / Qwen-MoE checkpoint `t` (per-expert names).
  Qwen-MoE layers with (i + 1) % decoder_sparse_step != 0 are dense MLPs (mlp.gate_proj...)."""
  t = {name: np.asarray(w, np.float64) for name, w in t.items()}
  eps, k = cfg['rms_norm_eps'], cfg['num_experts_per_tok']
  norm_topk = cfg['model_type'] == 'mixtral' or bool(cfg.get('norm_topk_prob'))
  x = t['model.embed_tokens.weight'][tokens]
  for i in range(cfg['num_hidden_layers']):
    p = f'model.layers.{i}.'
    x = x + attention(rms_norm(x, t[p + 'input_layernorm.weight'], eps), t, p, cfg)
    m = rms_norm(x, t[p + 'post_attention_layernorm.weight'], eps)
    if f'{p}mlp.gate_proj.weight' in t:
      x = x + swiglu(m, Swiglu(*(t[f'{p}mlp.{w}.weight']
                                 for w in ('gate_proj', 'up_proj', 'down_proj'))))
    else:
      x = x + sparse_moe(m, layer_moe(t, p, cfg), k, norm_topk)
  x = rms_norm(x, t['model.norm.weight'], eps)
  return x @ t.get('lm_head.weight', t['model.embed_tokens.weight']).T


# Random checkpoints in the HF layout, for the tests to write.

def _expert_names(cfg: dict, p: str) -> tuple[str, tuple[str, str, str], int]:
  """(the MoE block's prefix, its (gate, up, down) names, expert count) in layer prefix `p`."""
  if cfg['model_type'] == 'mixtral':
    return f'{p}block_sparse_moe.', ('w1', 'w3', 'w2'), cfg['num_local_experts']
  return f'{p}mlp.', ('gate_proj', 'up_proj', 'down_proj'), cfg['num_experts']


def is_moe_layer(cfg: dict, i: int) -> bool:
  return (i + 1) % cfg.get('decoder_sparse_step', 1) == 0


def random_checkpoint(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
  """Random float32 tensors of a Mixtral / Qwen-MoE config, per-expert names, [out, in]."""
  rng = np.random.default_rng(seed)
  d, v, n, kv = (cfg['hidden_size'], cfg['vocab_size'], cfg['num_attention_heads'],
                 cfg['num_key_value_heads'])
  h = cfg.get('head_dim') or d // n
  w = lambda *shape: (rng.standard_normal(shape) * shape[-1] ** -0.5).astype(np.float32)
  norm = lambda size: (1 + 0.3 * rng.standard_normal(size)).astype(np.float32)
  t = {'model.embed_tokens.weight': w(v, d), 'model.norm.weight': norm(d),
       'lm_head.weight': w(v, d)}
  for i in range(cfg['num_hidden_layers']):
    p = f'model.layers.{i}.'
    t |= {p + 'self_attn.q_proj.weight': w(n * h, d), p + 'self_attn.k_proj.weight': w(kv * h, d),
          p + 'self_attn.v_proj.weight': w(kv * h, d), p + 'self_attn.o_proj.weight': w(d, n * h),
          p + 'input_layernorm.weight': norm(d), p + 'post_attention_layernorm.weight': norm(d)}
    if cfg.get('qkv_bias', cfg['model_type'] == 'qwen2_moe') or cfg.get('attention_bias'):
      t |= {f'{p}self_attn.{x}_proj.bias': w(width) for x, width in
            (('q', n * h), ('k', kv * h), ('v', kv * h))}
    if cfg.get('attention_bias'):  # Qwen3-MoE: o_proj too.
      t[p + 'self_attn.o_proj.bias'] = w(d)
    if cfg['model_type'] == 'qwen3_moe':
      t |= {p + 'self_attn.q_norm.weight': norm(h), p + 'self_attn.k_norm.weight': norm(h)}
    if not is_moe_layer(cfg, i):
      f = cfg['intermediate_size']
      t |= {p + 'mlp.gate_proj.weight': w(f, d), p + 'mlp.up_proj.weight': w(f, d),
            p + 'mlp.down_proj.weight': w(d, f)}
      continue
    block, (gate, up, down), experts = _expert_names(cfg, p)
    f = cfg.get('moe_intermediate_size') or cfg['intermediate_size']
    t[block + 'gate.weight'] = 3 * w(experts, d)  # Decisive routing: no near-ties in the top-k.
    for e in range(experts):
      q = f'{block}experts.{e}.'
      t |= {f'{q}{gate}.weight': w(f, d), f'{q}{up}.weight': w(f, d), f'{q}{down}.weight': w(d, f)}
    if cfg.get('shared_expert_intermediate_size'):
      s = cfg['shared_expert_intermediate_size']
      t |= {p + 'mlp.shared_expert.gate_proj.weight': w(s, d),
            p + 'mlp.shared_expert.up_proj.weight': w(s, d),
            p + 'mlp.shared_expert.down_proj.weight': w(d, s),
            p + 'mlp.shared_expert_gate.weight': w(1, d)}
  return t


def fused_checkpoint(t: dict[str, np.ndarray], cfg: dict) -> dict[str, np.ndarray]:
  """`t` with each MoE layer's experts in transformers 5's fused layout: mlp.gate.weight,
  mlp.experts.gate_up_proj [E, 2f, d] (gate rows, then up rows) and mlp.experts.down_proj
  [E, d, f]."""
  out = dict(t)
  for i in range(cfg['num_hidden_layers']):
    if not is_moe_layer(cfg, i):
      continue
    p = f'model.layers.{i}.'
    block, (gate, up, down), experts = _expert_names(cfg, p)
    pop = lambda e, name: out.pop(f'{block}experts.{e}.{name}.weight')
    out[p + 'mlp.experts.gate_up_proj'] = np.stack(
        [np.concatenate([pop(e, gate), pop(e, up)]) for e in range(experts)])
    out[p + 'mlp.experts.down_proj'] = np.stack([pop(e, down) for e in range(experts)])
    out[p + 'mlp.gate.weight'] = out.pop(block + 'gate.weight')
  return out
