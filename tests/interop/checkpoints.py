"""Tiny random Hugging Face checkpoints of each dense family, written by the tests themselves
(safetensors + config.json in transformers 4's or 5's layout), with HF names and layouts.

CASES: name -> a config.json in transformers 4's layout (top-level rope_theta, rope_scaling);
`v5(config)` moves its RoPE into transformers 5's `rope_parameters` (per layer type for
Gemma 3). Sequences of T = 24 tokens reach past every window (5) and RoPE threshold (16).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

T = 24
BASE = dict(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-5, rope_theta=10_000.0, tie_word_embeddings=False, hidden_act='silu',
            bos_token_id=1, eos_token_id=2)
GEMMA = dict(BASE, hidden_activation='gelu_pytorch_tanh', hidden_act='gelu_pytorch_tanh',
             head_dim=16, query_pre_attn_scalar=12, sliding_window=5, tie_word_embeddings=True,
             num_hidden_layers=4)
CASES = {
    'llama2': dict(BASE, model_type='llama'),
    'llama3.1': dict(BASE, model_type='llama', rope_theta=500_000.0, rope_scaling=dict(
        rope_type='llama3', factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64)),
    'llama3.2_tied': dict(BASE, model_type='llama', rope_theta=500_000.0, tie_word_embeddings=True,
                          num_key_value_heads=1, rope_scaling=dict(
                              type='llama3', factor=32.0, low_freq_factor=1.0,
                              high_freq_factor=4.0, original_max_position_embeddings=64)),
    'smollm2': dict(BASE, model_type='llama', rope_theta=100_000.0, tie_word_embeddings=True),
    'llama_linear': dict(BASE, model_type='llama', rope_scaling=dict(type='linear', factor=4.0)),
    'llama_dynamic': dict(BASE, model_type='llama', max_position_embeddings=16,
                          rope_scaling=dict(rope_type='dynamic', factor=2.0)),
    'llama_yarn': dict(BASE, model_type='llama', rope_scaling=dict(
        rope_type='yarn', factor=4.0, original_max_position_embeddings=16)),
    'llama_bias': dict(BASE, model_type='llama', attention_bias=True),
    'mistral': dict(BASE, model_type='mistral', rope_theta=1_000_000.0, sliding_window=None),
    'mistral_window': dict(BASE, model_type='mistral', rope_theta=1_000_000.0, sliding_window=5),
    'qwen2': dict(BASE, model_type='qwen2', rope_theta=1_000_000.0, use_sliding_window=False,
                  sliding_window=32, max_window_layers=2),
    'qwen3': dict(BASE, model_type='qwen3', head_dim=16, rope_theta=1_000_000.0,
                  attention_bias=False),
    'phi3': dict(BASE, model_type='phi3', sliding_window=5, original_max_position_embeddings=16,
                 rope_scaling=dict(type='longrope', short_factor=[1.0, 1.2, 1.5, 2.0],
                                   long_factor=[1.0, 2.0, 4.0, 8.0])),
    'gemma2': dict(GEMMA, model_type='gemma2', attn_logit_softcapping=5.0,
                   final_logit_softcapping=3.0),
    'gemma3_text': dict(GEMMA, model_type='gemma3_text', sliding_window_pattern=3,
                        rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
                        rope_scaling=dict(rope_type='linear', factor=8.0)),
}


def v5(cfg: dict) -> dict:
  """`cfg` in transformers 5's layout: RoPE settings inside `rope_parameters`."""
  cfg = dict(cfg)
  scaling = dict(cfg.pop('rope_scaling', None) or {})
  kind = scaling.pop('type', scaling.pop('rope_type', 'default'))
  rope = {'rope_type': kind, 'rope_theta': cfg.pop('rope_theta'), **scaling}
  if cfg['model_type'] == 'gemma3_text':
    local = {'rope_type': 'default', 'rope_theta': cfg.pop('rope_local_base_freq')}
    rope = {'full_attention': rope, 'sliding_attention': local}
  cfg['rope_parameters'] = rope
  return cfg


def random_tensors(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
  """Random float32 tensors of `cfg`'s checkpoint (norm weights near their identity)."""
  rng = np.random.default_rng(seed)
  mt, d, f, v = cfg['model_type'], cfg['hidden_size'], cfg['intermediate_size'], cfg['vocab_size']
  n, kv = cfg['num_attention_heads'], cfg['num_key_value_heads']
  h = cfg.get('head_dim') or d // n
  gemma = mt.startswith('gemma')
  w = lambda *shape: (rng.standard_normal(shape) * shape[-1] ** -0.5).astype(np.float32)
  norm = lambda size: ((0 if gemma else 1) + 0.3 * rng.standard_normal(size)).astype(np.float32)
  t = {'model.embed_tokens.weight': w(v, d), 'model.norm.weight': norm(d)}
  if not cfg['tie_word_embeddings']:
    t['lm_head.weight'] = w(v, d)
  for i in range(cfg['num_hidden_layers']):
    p = f'model.layers.{i}.'
    if mt == 'phi3':
      t[p + 'self_attn.qkv_proj.weight'] = w((n + 2 * kv) * h, d)
      t[p + 'mlp.gate_up_proj.weight'] = w(2 * f, d)
    else:
      t |= {p + 'self_attn.q_proj.weight': w(n * h, d), p + 'self_attn.k_proj.weight': w(kv * h, d),
            p + 'self_attn.v_proj.weight': w(kv * h, d), p + 'mlp.gate_proj.weight': w(f, d),
            p + 'mlp.up_proj.weight': w(f, d)}
    t |= {p + 'self_attn.o_proj.weight': w(d, n * h), p + 'mlp.down_proj.weight': w(d, f),
          p + 'input_layernorm.weight': norm(d), p + 'post_attention_layernorm.weight': norm(d)}
    if mt == 'qwen2' or cfg.get('attention_bias'):
      t |= {p + f'self_attn.{x}_proj.bias': w(size) for x, size in
            (('q', n * h), ('k', kv * h), ('v', kv * h))}
    if cfg.get('attention_bias'):
      t[p + 'self_attn.o_proj.bias'] = w(d)
    if mt in ('qwen3', 'gemma3_text'):
      t |= {p + 'self_attn.q_norm.weight': norm(h), p + 'self_attn.k_norm.weight': norm(h)}
    if gemma:
      t |= {p + 'pre_feedforward_layernorm.weight': norm(d),
            p + 'post_feedforward_layernorm.weight': norm(d)}
  return t


def write(directory: Path, tensors: dict, cfg: dict) -> Path:
  """`directory` with model.safetensors and config.json."""
  directory.mkdir(parents=True, exist_ok=True)
  save_file(tensors, str(directory / 'model.safetensors'))
  (directory / 'config.json').write_text(json.dumps(cfg))
  return directory


def tokens(cfg: dict, batch: int = 2, length: int = T, seed: int = 1) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, cfg['vocab_size'], (batch, length))
