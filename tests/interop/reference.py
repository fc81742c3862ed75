"""An independent float64 numpy forward pass of each dense Hugging Face family, from the HF
tensors and config.json (either layout), written from the families' published descriptions
(transformers' modeling_<family>.py and modeling_rope_utils.py), apart from paxlike's code.

`logits(tensors, config, tokens)` -> [B, T, V]. Conventions: rotate-half RoPE, repeat_kv GQA,
causal mask, a sliding window W letting query i see keys i - W < j <= i.
"""

from __future__ import annotations

import math

import numpy as np


def _rope_params(cfg: dict, layer_type: str) -> dict:
  """The RoPE dict of a layer type: transformers 5's rope_parameters, or 4's top-level keys."""
  params = cfg.get('rope_parameters')
  if params:
    params = params.get(layer_type, params) if isinstance(params.get(layer_type), dict) else params
    return {'rope_theta': cfg.get('rope_theta'), **params}
  if layer_type == 'sliding_attention' and cfg['model_type'] == 'gemma3_text':
    return {'rope_type': 'default', 'rope_theta': cfg.get('rope_local_base_freq', 10_000.0)}
  return {**(cfg.get('rope_scaling') or {}), 'rope_theta': cfg.get('rope_theta', 10_000.0)}


def inv_freq(cfg: dict, layer_type: str, dim: int, seq_len: int) -> tuple[np.ndarray, float]:
  """(inverse frequencies [dim/2], cos/sin scale) for a call whose longest position is
  seq_len - 1."""
  p = _rope_params(cfg, layer_type)
  kind = p.get('rope_type', p.get('type', 'default'))
  base, factor = float(p['rope_theta']), p.get('factor')
  orig = cfg.get('original_max_position_embeddings') or p.get(
      'original_max_position_embeddings') or cfg['max_position_embeddings']
  expo = np.arange(0, dim, 2) / dim
  freq = base ** -expo
  if kind == 'default':
    return freq, 1.0
  if kind == 'linear':
    return freq / factor, 1.0
  if kind == 'dynamic':
    length = max(seq_len, cfg['max_position_embeddings'])
    grown = base * (factor * length / cfg['max_position_embeddings'] - (factor - 1)) ** (
        dim / (dim - 2))
    return grown ** -expo, 1.0
  if kind == 'llama3':
    wavelen = 2 * math.pi / freq
    low, high = orig / p['low_freq_factor'], orig / p['high_freq_factor']
    smooth = (orig / wavelen - p['low_freq_factor']) / (p['high_freq_factor'] - p['low_freq_factor'])
    out = np.where(wavelen > low, freq / factor, freq)
    between = (wavelen >= high) & (wavelen <= low)
    return np.where(between, (1 - smooth) * freq / factor + smooth * freq, out), 1.0
  if kind == 'yarn':
    dim_of = lambda rot: dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))
    lo = max(math.floor(dim_of(p.get('beta_fast', 32))), 0)
    hi = min(math.ceil(dim_of(p.get('beta_slow', 1))), dim - 1)
    ramp = np.clip((np.arange(dim // 2) - lo) / max(hi - lo, 1e-3), 0, 1)
    mix = freq / factor * ramp + freq * (1 - ramp)
    scale = p.get('attention_factor') or 0.1 * math.log(factor) + 1
    return mix, scale
  if kind == 'longrope':
    ext = np.asarray(p['long_factor'] if seq_len > orig else p['short_factor'])
    ratio = cfg['max_position_embeddings'] / orig if factor is None else factor
    scale = p.get('attention_factor') or math.sqrt(1 + math.log(ratio) / math.log(orig))
    return freq / ext, scale
  raise ValueError(kind)


def _rms(x: np.ndarray, w: np.ndarray, eps: float, gemma: bool) -> np.ndarray:
  normed = x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + eps)
  return normed * ((1 + w) if gemma else w)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
  return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _layer_types(cfg: dict) -> list[str]:
  n = cfg['num_hidden_layers']
  if cfg.get('layer_types'):
    return list(cfg['layer_types'])
  every = {'gemma2': 2, 'gemma3_text': cfg.get('sliding_window_pattern', 6)}.get(
      cfg['model_type'])
  if every is None:  # Qwen's window is off unless use_sliding_window; Mistral's, Phi-3's on.
    windowed = cfg.get('sliding_window') and (
        cfg.get('use_sliding_window') or not cfg['model_type'].startswith('qwen'))
    return ['sliding_attention' if windowed else 'full_attention'] * n
  return ['full_attention' if (i + 1) % every == 0 else 'sliding_attention' for i in range(n)]


def _attention(t: dict, p: str, a: np.ndarray, cfg: dict, kind: str) -> np.ndarray:
  """One layer's self-attention output [B, T, d] (before o_proj's residual add)."""
  mt, n = cfg['model_type'], cfg['num_attention_heads']
  kv = cfg.get('num_key_value_heads') or n
  h = cfg.get('head_dim') or cfg['hidden_size'] // n
  b, T = a.shape[:2]
  if mt == 'phi3':
    q, k, v = np.split(a @ t[p + 'self_attn.qkv_proj.weight'].T, [n * h, (n + kv) * h], axis=-1)
  else:
    q, k, v = (a @ t[p + f'self_attn.{x}_proj.weight'].T for x in 'qkv')
    if p + 'self_attn.q_proj.bias' in t:
      q, k, v = (y + t[p + f'self_attn.{x}_proj.bias'] for y, x in zip((q, k, v), 'qkv'))
  q, k, v = q.reshape(b, T, n, h), k.reshape(b, T, kv, h), v.reshape(b, T, kv, h)
  gemma = mt.startswith('gemma')
  if p + 'self_attn.q_norm.weight' in t:
    eps = cfg.get('rms_norm_eps', 1e-6)
    q = _rms(q, t[p + 'self_attn.q_norm.weight'], eps, gemma)
    k = _rms(k, t[p + 'self_attn.k_norm.weight'], eps, gemma)
  freq, scale = inv_freq(cfg, kind, h, T)
  angles = np.arange(T)[:, None] * freq
  cos = np.concatenate([np.cos(angles)] * 2, -1)[:, None] * scale
  sin = np.concatenate([np.sin(angles)] * 2, -1)[:, None] * scale
  turn = lambda x: x * cos + np.concatenate([-x[..., h // 2:], x[..., :h // 2]], -1) * sin
  q, k = turn(q), turn(k)
  k, v = np.repeat(k, n // kv, axis=2), np.repeat(v, n // kv, axis=2)
  scalar = cfg.get('query_pre_attn_scalar') if gemma else None
  scores = np.einsum('bqnh,bknh->bnqk', q, k) * (scalar or h) ** -0.5
  if gemma and cfg.get('attn_logit_softcapping'):
    cap = cfg['attn_logit_softcapping']
    scores = np.tanh(scores / cap) * cap
  i, j = np.arange(T)[:, None], np.arange(T)[None]
  allowed = j <= i
  if kind == 'sliding_attention':
    allowed &= i - j < cfg['sliding_window']
  scores = np.where(allowed, scores, -np.inf)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  out = np.einsum('bnqk,bknh->bqnh', probs, v).reshape(b, T, n * h)
  out = out @ t[p + 'self_attn.o_proj.weight'].T
  return out + t[p + 'self_attn.o_proj.bias'] if p + 'self_attn.o_proj.bias' in t else out


def _mlp(t: dict, p: str, m: np.ndarray, cfg: dict) -> np.ndarray:
  if cfg['model_type'] == 'phi3':
    gate, up = np.split(m @ t[p + 'mlp.gate_up_proj.weight'].T, 2, axis=-1)
  else:
    gate, up = m @ t[p + 'mlp.gate_proj.weight'].T, m @ t[p + 'mlp.up_proj.weight'].T
  act = cfg.get('hidden_activation') or cfg.get('hidden_act', 'silu')
  gate = gate / (1 + np.exp(-gate)) if act == 'silu' else _gelu_tanh(gate)
  return (gate * up) @ t[p + 'mlp.down_proj.weight'].T


def logits(tensors: dict, cfg: dict, tokens: np.ndarray) -> np.ndarray:
  """float64 logits [B, T, V] of `tokens` [B, T]."""
  t = {k: np.asarray(x, np.float64) for k, x in tensors.items()}
  gemma = cfg['model_type'].startswith('gemma')
  eps = cfg.get('rms_norm_eps', 1e-6)
  x = t['model.embed_tokens.weight'][tokens]
  if gemma:
    x = x * math.sqrt(cfg['hidden_size'])
  for i, kind in enumerate(_layer_types(cfg)):
    p = f'model.layers.{i}.'
    h = _attention(t, p, _rms(x, t[p + 'input_layernorm.weight'], eps, gemma), cfg, kind)
    if gemma:
      h = _rms(h, t[p + 'post_attention_layernorm.weight'], eps, True)
      x = x + h
      m = _mlp(t, p, _rms(x, t[p + 'pre_feedforward_layernorm.weight'], eps, True), cfg)
      x = x + _rms(m, t[p + 'post_feedforward_layernorm.weight'], eps, True)
    else:
      x = x + h
      x = x + _mlp(t, p, _rms(x, t[p + 'post_attention_layernorm.weight'], eps, False), cfg)
  x = _rms(x, t['model.norm.weight'], eps, gemma)
  out = x @ t.get('lm_head.weight', t['model.embed_tokens.weight']).T
  if gemma and cfg.get('final_logit_softcapping'):
    cap = cfg['final_logit_softcapping']
    out = np.tanh(out / cap) * cap
  return out
