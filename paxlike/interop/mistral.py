"""model_type 'mistral': Llama's tensors and layers, every layer attending within
`sliding_window` when the config sets one (null: full attention), no biases."""

from __future__ import annotations

from typing import Any, Mapping

from paxlike.errors import UserError
from paxlike.interop import hf_fields, llama
from paxlike.interop.architecture import Architecture
from paxlike.interop.rope_config import read_rope, rope_config
from paxlike.layers import TransformerLM

KNOWN = {'hidden_act', 'sliding_window', 'attention_dropout', 'layer_types'}
ALLOWED = {'mlp_activation', 'head_dim', 'rope_scaling', 'sliding_window'}


def model_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  hf_fields.check_keys(hf, KNOWN, 'mistral')
  hf_fields.refuse(hf, 'attention_dropout', (0, 0.0))
  base, scaling = read_rope(hf)
  window = hf.get('sliding_window')
  fields = {**hf_fields.dense_fields(hf), 'rope_base': base, 'rope_scaling': scaling,
            'sliding_window': None if window is None else int(window),
            'mlp_activation': hf_fields.activation(hf)}
  hf_fields.check_layer_types(hf, fields)
  return fields


def mismatches(model: TransformerLM) -> list[str]:
  return hf_fields.unsupported(model, ALLOWED)


def hf_config(model: TransformerLM) -> dict[str, Any]:
  problems = mismatches(model)
  if problems:
    raise UserError(f'not a Mistral: {", ".join(problems)}')
  return {'architectures': ['MistralForCausalLM'], 'model_type': 'mistral',
          **hf_fields.dense_config(model), **rope_config(model.rope_base, model.rope_scaling),
          'hidden_act': hf_fields.HF_ACTIVATION[model.mlp_activation or 'silu'],
          'sliding_window': model.sliding_window, 'attention_dropout': 0.0}


ARCHITECTURE = Architecture(
    'mistral', 'MistralForCausalLM', model_fields, hf_config, llama.tensor_names, mismatches)
