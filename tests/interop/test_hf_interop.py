"""HF Llama safetensors import/export: logits equal an independent numpy Llama; round-trips."""

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import fiddle as fdl
from safetensors.numpy import save_file

from paxlike.errors import UserError
from paxlike import interop
from paxlike.interop import checkpoint

HF_CONFIG = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                 rms_norm_eps=1e-5, rope_theta=500.0, tie_word_embeddings=False,
                 hidden_act='silu', model_type='llama')


def random_checkpoint(cfg: dict, seed: int = 0, qk_norm: bool = False) -> dict[str, np.ndarray]:
  """A random float32 Llama checkpoint with HF names and [out, in] layouts."""
  rng = np.random.default_rng(seed)
  d, f, v = cfg['hidden_size'], cfg['intermediate_size'], cfg['vocab_size']
  n, kv = cfg['num_attention_heads'], cfg['num_key_value_heads']
  h = d // n
  w = lambda *shape: (rng.standard_normal(shape) * shape[-1] ** -0.5).astype(np.float32)
  norm = lambda size: (1 + 0.3 * rng.standard_normal(size)).astype(np.float32)
  t = {'model.embed_tokens.weight': w(v, d), 'model.norm.weight': norm(d)}
  if not cfg['tie_word_embeddings']:
    t['lm_head.weight'] = w(v, d)
  for i in range(cfg['num_hidden_layers']):
    p = f'model.layers.{i}.'
    t |= {p + 'self_attn.q_proj.weight': w(n * h, d), p + 'self_attn.k_proj.weight': w(kv * h, d),
          p + 'self_attn.v_proj.weight': w(kv * h, d), p + 'self_attn.o_proj.weight': w(d, n * h),
          p + 'mlp.gate_proj.weight': w(f, d), p + 'mlp.up_proj.weight': w(f, d),
          p + 'mlp.down_proj.weight': w(d, f), p + 'input_layernorm.weight': norm(d),
          p + 'post_attention_layernorm.weight': norm(d)}
    if qk_norm:
      t |= {p + 'self_attn.q_norm.weight': norm(h), p + 'self_attn.k_norm.weight': norm(h)}
  return t


def reference_logits(t: dict[str, np.ndarray], cfg: dict, tokens: np.ndarray) -> np.ndarray:
  """Plain-numpy float64 Llama forward with HF conventions (rotate_half rope, repeat_kv GQA)."""
  t = {k: x.astype(np.float64) for k, x in t.items()}
  d, n, kv = cfg['hidden_size'], cfg['num_attention_heads'], cfg['num_key_value_heads']
  h, eps, T = d // n, cfg['rms_norm_eps'], tokens.shape[1]

  def rms(x, weight):
    return x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + eps) * weight

  inv_freq = 1.0 / cfg['rope_theta'] ** (np.arange(0, h, 2) / h)
  emb = np.concatenate([np.outer(np.arange(T), inv_freq)] * 2, axis=-1)[:, None, :]  # [T, 1, h]
  rotate_half = lambda x: np.concatenate([-x[..., h // 2:], x[..., : h // 2]], axis=-1)
  rope = lambda x: x * np.cos(emb) + rotate_half(x) * np.sin(emb)
  silu = lambda x: x / (1 + np.exp(-x))
  x = t['model.embed_tokens.weight'][tokens]
  causal = np.tril(np.ones((T, T), bool))
  for i in range(cfg['num_hidden_layers']):
    p = f'model.layers.{i}.'
    a = rms(x, t[p + 'input_layernorm.weight'])
    q = (a @ t[p + 'self_attn.q_proj.weight'].T).reshape(*a.shape[:2], n, h)
    k = (a @ t[p + 'self_attn.k_proj.weight'].T).reshape(*a.shape[:2], kv, h)
    v = (a @ t[p + 'self_attn.v_proj.weight'].T).reshape(*a.shape[:2], kv, h)
    if p + 'self_attn.q_norm.weight' in t:
      q, k = rms(q, t[p + 'self_attn.q_norm.weight']), rms(k, t[p + 'self_attn.k_norm.weight'])
    q, k = rope(q), rope(k)
    k, v = np.repeat(k, n // kv, axis=2), np.repeat(v, n // kv, axis=2)  # HF repeat_kv
    scores = np.einsum('bqnh,bknh->bnqk', q, k) / np.sqrt(h)
    scores = np.where(causal, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.einsum('bnqk,bknh->bqnh', probs, v).reshape(*a.shape[:2], n * h)
    x = x + out @ t[p + 'self_attn.o_proj.weight'].T
    m = rms(x, t[p + 'post_attention_layernorm.weight'])
    gated = silu(m @ t[p + 'mlp.gate_proj.weight'].T) * (m @ t[p + 'mlp.up_proj.weight'].T)
    x = x + gated @ t[p + 'mlp.down_proj.weight'].T
  x = rms(x, t['model.norm.weight'])
  head = t.get('lm_head.weight', t['model.embed_tokens.weight'])
  return x @ head.T


def write_checkpoint(directory, tensors: dict, cfg: dict) -> None:
  save_file(tensors, str(directory / 'model.safetensors'))
  (directory / 'config.json').write_text(json.dumps(cfg))


def _logits(model_cfg, params, tokens) -> np.ndarray:
  model = fdl.build(model_cfg)
  return np.asarray(model.apply({'params': params}, jnp.asarray(tokens)))


TOKENS = np.random.default_rng(1).integers(0, 97, (2, 12))
CASES = {
    'gqa_untied': ({}, False),
    'mqa_tied': ({'num_key_value_heads': 1, 'tie_word_embeddings': True}, False),
}


@pytest.mark.parametrize('case', CASES)
def test_import_gives_reference_logits(tmp_path, case):
  changes, qk_norm = CASES[case]
  cfg = {**HF_CONFIG, **changes}
  tensors = random_checkpoint(cfg, qk_norm=qk_norm)
  write_checkpoint(tmp_path, tensors, cfg)
  model_cfg, params = interop.load_hf_checkpoint(tmp_path, qk_norm=qk_norm)
  ref = reference_logits(tensors, cfg, TOKENS)
  np.testing.assert_allclose(_logits(model_cfg, params, TOKENS), ref, atol=1e-4, rtol=1e-4)
  # Scanned layers: same checkpoint, params stacked under 'blocks', same logits.
  scan_cfg, scan_params = interop.load_hf_checkpoint(tmp_path, qk_norm=qk_norm, scan_layers=True)
  assert 'blocks' in scan_params and 'block_0' not in scan_params
  np.testing.assert_allclose(_logits(scan_cfg, scan_params, TOKENS), ref, atol=1e-4, rtol=1e-4)
  # Export is bitwise the original, from either tree layout.
  for c, p in ((model_cfg, params), (scan_cfg, scan_params)):
    exported = interop.export_params(p, fdl.build(c))
    assert exported.keys() == tensors.keys()
    for name, value in tensors.items():
      assert exported[name].dtype == value.dtype and exported[name].tobytes() == value.tobytes(), name


def test_interleaved_rope_layout_would_not_match():
  """The reference is sensitive to the rope layout: Meta's interleaved q/k order gives other logits."""
  tensors = random_checkpoint(HF_CONFIG)
  h = HF_CONFIG['hidden_size'] // HF_CONFIG['num_attention_heads']
  # HF's convert_llama_weights_to_hf permutes Meta's interleaved rows to rotate-half; undo it.
  unpermute = lambda w: w.reshape(-1, 2, h // 2, w.shape[1]).transpose(0, 2, 1, 3).reshape(w.shape)
  meta = {k: unpermute(v) if k.endswith(('q_proj.weight', 'k_proj.weight')) else v
          for k, v in tensors.items()}
  model = fdl.build(interop.config_from_hf(HF_CONFIG))
  logits = model.apply({'params': interop.import_params(meta, model)}, jnp.asarray(TOKENS))
  assert not np.allclose(np.asarray(logits), reference_logits(tensors, HF_CONFIG, TOKENS), atol=1e-2)


def test_save_round_trip_and_bf16(tmp_path):
  tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in random_checkpoint(HF_CONFIG).items()}
  write_checkpoint(tmp_path, tensors, HF_CONFIG)
  model_cfg, params = interop.load_hf_checkpoint(tmp_path)
  assert all(x.dtype == np.float32 for x in jax.tree.leaves(params))  # upcast exactly
  out = tmp_path / 'out'
  interop.save_hf_checkpoint(params, fdl.build(model_cfg), out, dtype=ml_dtypes.bfloat16)
  again = checkpoint.read_safetensors(out)
  assert again.keys() == tensors.keys()
  assert all(again[k].tobytes() == tensors[k].tobytes() for k in tensors)
  saved = json.loads((out / 'config.json').read_text())
  assert saved['torch_dtype'] == 'bfloat16'
  assert {k: saved[k] for k in HF_CONFIG} == HF_CONFIG
  assert interop.config_from_hf(saved) == model_cfg


def test_mismatches_are_user_errors():
  cfg = HF_CONFIG
  model = fdl.build(interop.config_from_hf(cfg))
  tensors = random_checkpoint(cfg)
  with pytest.raises(UserError, match='missing.*mlp.down_proj'):
    interop.import_params({k: v for k, v in tensors.items() if 'layers.1.mlp.down' not in k}, model)
  with pytest.raises(UserError, match='unexpected.*layers.2'):
    interop.import_params({**tensors, 'model.layers.2.mlp.up_proj.weight': tensors['lm_head.weight']},
                           model)
  wrong = {**tensors, 'model.layers.0.mlp.up_proj.weight': np.zeros((8, 64), np.float32)}
  with pytest.raises(UserError, match=r'up_proj.*is \[8, 64\].*needs \[96, 64\]'):
    interop.import_params(wrong, model)
  with pytest.raises(UserError, match='rope_scaling'):
    interop.config_from_hf({**cfg, 'rope_scaling': {'rope_type': 'llama3', 'factor': 8.0}})
  with pytest.raises(UserError, match='gated_mlp=False'):
    interop.name_map(model.clone(gated_mlp=False))
