"""model_type 'qwen3': Llama's tensors plus per-head q/k RMSNorm (before RoPE), an explicit
`head_dim` (often not hidden_size / heads) and optional q/k/v/o biases (`attention_bias`)."""

from __future__ import annotations

from typing import Any, Mapping

from paxlike.errors import UserError
from paxlike.interop import hf_fields, llama
from paxlike.interop.architecture import Architecture
from paxlike.interop.rope_config import read_rope, rope_config
from paxlike.layers import TransformerLM

KNOWN = {'hidden_act', 'attention_bias', 'use_sliding_window', 'sliding_window',
         'max_window_layers', 'attention_dropout', 'layer_types'}
ALLOWED = {'mlp_activation', 'head_dim', 'rope_scaling', 'qkv_bias', 'out_bias', 'qk_norm'}


def model_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  hf_fields.check_keys(hf, KNOWN, 'qwen3')
  hf_fields.refuse(hf, 'use_sliding_window', (False,))
  hf_fields.refuse(hf, 'attention_dropout', (0, 0.0))
  base, scaling = read_rope(hf)
  bias = bool(hf.get('attention_bias', False))
  fields = {**hf_fields.dense_fields(hf), 'rope_base': base, 'rope_scaling': scaling,
            'qk_norm': True, 'qkv_bias': bias, 'out_bias': bias,
            'mlp_activation': hf_fields.activation(hf)}
  hf_fields.check_layer_types(hf, fields)
  return fields


def mismatches(model: TransformerLM) -> list[str]:
  out = hf_fields.unsupported(model, ALLOWED, {'qk_norm': True})
  if model.qkv_bias != model.out_bias:
    out.append(f'qkv_bias={model.qkv_bias} with out_bias={model.out_bias} (Qwen3 has both or '
               'neither)')
  return out


def hf_config(model: TransformerLM) -> dict[str, Any]:
  problems = mismatches(model)
  if problems:
    raise UserError(f'not a Qwen3: {", ".join(problems)}')
  return {'architectures': ['Qwen3ForCausalLM'], 'model_type': 'qwen3',
          **hf_fields.dense_config(model), **rope_config(model.rope_base, model.rope_scaling),
          'hidden_act': hf_fields.HF_ACTIVATION[model.mlp_activation or 'silu'],
          'attention_bias': model.qkv_bias, 'use_sliding_window': False,
          'attention_dropout': 0.0}


ARCHITECTURE = Architecture(
    'qwen3', 'Qwen3ForCausalLM', model_fields, hf_config, llama.tensor_names, mismatches)
