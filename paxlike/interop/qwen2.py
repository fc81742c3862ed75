"""model_type 'qwen2' (Qwen2, Qwen2.5): Llama's tensors plus q/k/v biases (no o bias).
Qwen2's optional sliding window (`use_sliding_window`, applied above `max_window_layers`) is
refused when on."""

from __future__ import annotations

from typing import Any, Mapping

from paxlike.errors import UserError
from paxlike.interop import hf_fields, llama
from paxlike.interop.architecture import Architecture
from paxlike.interop.rope_config import read_rope, rope_config
from paxlike.layers import TransformerLM

KNOWN = {'hidden_act', 'use_sliding_window', 'sliding_window', 'max_window_layers',
         'attention_dropout', 'layer_types', 'use_mrope'}
ALLOWED = {'mlp_activation', 'rope_scaling', 'qkv_bias'}


def model_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  hf_fields.check_keys(hf, KNOWN, 'qwen2')
  hf_fields.refuse(hf, 'use_sliding_window', (False,))
  hf_fields.refuse(hf, 'use_mrope', (False,))
  hf_fields.refuse(hf, 'attention_dropout', (0, 0.0))
  base, scaling = read_rope(hf)
  fields = {**hf_fields.dense_fields(hf), 'rope_base': base, 'rope_scaling': scaling,
            'qkv_bias': True, 'mlp_activation': hf_fields.activation(hf)}
  if fields['head_dim'] is not None:
    raise UserError(f'config.json head_dim={hf["head_dim"]} is not hidden_size / '
                    'num_attention_heads, which qwen2 requires')
  hf_fields.check_layer_types(hf, fields)
  return fields


def mismatches(model: TransformerLM) -> list[str]:
  return hf_fields.unsupported(model, ALLOWED, {'qkv_bias': True})


def hf_config(model: TransformerLM) -> dict[str, Any]:
  problems = mismatches(model)
  if problems:
    raise UserError(f'not a Qwen2: {", ".join(problems)}')
  config = {'architectures': ['Qwen2ForCausalLM'], 'model_type': 'qwen2',
            **hf_fields.dense_config(model), **rope_config(model.rope_base, model.rope_scaling),
            'hidden_act': hf_fields.HF_ACTIVATION[model.mlp_activation or 'silu'],
            'use_sliding_window': False, 'attention_dropout': 0.0}
  del config['head_dim']
  return config


ARCHITECTURE = Architecture(
    'qwen2', 'Qwen2ForCausalLM', model_fields, hf_config, llama.tensor_names, mismatches)
