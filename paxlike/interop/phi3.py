"""model_type 'phi3' (Phi-3, Phi-3.5, Phi-4 mini): Llama's layers with fused projections in
the checkpoint, split on import and fused again on export:

    model.layers.{i}.self_attn.qkv_proj.weight  [(n + 2k)·h, d] = [q_proj; k_proj; v_proj]
    model.layers.{i}.mlp.gate_up_proj.weight    [2f, d]         = [gate_proj; up_proj]

Phi-3's `sliding_window` (every layer) is honoured; RoPE may be scaled ('longrope' with the
top-level `original_max_position_embeddings`, as Phi-3 128k checkpoints have it)."""

from __future__ import annotations

from typing import Any, Mapping

from paxlike.errors import UserError
from paxlike.interop import hf_fields, llama
from paxlike.interop.architecture import Architecture, NameMap, fused, transposed
from paxlike.interop.rope_config import read_rope, rope_config
from paxlike.layers import TransformerLM

KNOWN = {'hidden_act', 'resid_pdrop', 'embd_pdrop', 'attention_dropout', 'sliding_window',
         'original_max_position_embeddings', 'partial_rotary_factor', 'attention_bias'}
ALLOWED = {'mlp_activation', 'rope_scaling', 'sliding_window'}


def tensor_names(model: TransformerLM) -> NameMap:
  n, kv, h = model.num_heads, model.num_kv_heads or model.num_heads, llama.head_dim(model)
  attention = llama.attention_names(model)
  qkv = [attention.pop(f'self_attn.{x}_proj.weight') for x in 'qkv']
  mlp = llama.mlp_names()
  gate_up = [mlp.pop('mlp.gate_proj.weight'), mlp.pop('mlp.up_proj.weight')]
  layer = {
      **attention, **mlp, **llama.norm_names(),
      'self_attn.qkv_proj.weight': fused(tuple(t.paths[0] for t in qkv),
                                         (n * h, kv * h, kv * h), tuple(qkv)),
      'mlp.gate_up_proj.weight': fused(tuple(t.paths[0] for t in gate_up),
                                       (model.d_ff, model.d_ff), tuple(gate_up)),
  }
  return llama.decoder_names(model, layer)


def model_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  hf_fields.check_keys(hf, KNOWN, 'phi3')
  for key in ('resid_pdrop', 'embd_pdrop', 'attention_dropout'):
    hf_fields.refuse(hf, key, (0, 0.0))
  hf_fields.refuse(hf, 'attention_bias', (False,))
  base, scaling = read_rope(hf)
  window = hf.get('sliding_window')
  fields = {**hf_fields.dense_fields(hf), 'rope_base': base, 'rope_scaling': scaling,
            'sliding_window': None if window is None else int(window),
            'mlp_activation': hf_fields.activation(hf)}
  if fields['head_dim'] is not None:
    raise UserError(f'config.json head_dim={hf["head_dim"]} is not hidden_size / '
                    'num_attention_heads, which phi3 requires')
  return fields


def mismatches(model: TransformerLM) -> list[str]:
  return hf_fields.unsupported(model, ALLOWED)


def hf_config(model: TransformerLM) -> dict[str, Any]:
  problems = mismatches(model)
  if problems:
    raise UserError(f'not a Phi-3: {", ".join(problems)}')
  config = {'architectures': ['Phi3ForCausalLM'], 'model_type': 'phi3',
            **hf_fields.dense_config(model), **rope_config(model.rope_base, model.rope_scaling),
            'hidden_act': hf_fields.HF_ACTIVATION[model.mlp_activation or 'silu'],
            'sliding_window': model.sliding_window, 'resid_pdrop': 0.0, 'embd_pdrop': 0.0,
            'attention_dropout': 0.0}
  if model.rope_scaling is not None and model.rope_scaling.kind == 'longrope':
    config['original_max_position_embeddings'] = model.rope_scaling.original_max_len
  del config['head_dim']
  return config


ARCHITECTURE = Architecture(
    'phi3', 'Phi3ForCausalLM', model_fields, hf_config, tensor_names, mismatches)
