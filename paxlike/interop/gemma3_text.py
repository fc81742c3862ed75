"""model_type 'gemma3_text' (Gemma 3's text model, 1B and the text tower's layout): Gemma 2's
layers (see `gemma2`) plus per-head q/k RMSNorm (1 + w), every `sliding_window_pattern`-th
layer global (6: five local, one global), and per-layer RoPE: local layers use
`rope_local_base_freq` unscaled, global ones `rope_theta` with the scaling. Soft-capping is
off by default. transformers 5 writes the two RoPEs as `rope_parameters['sliding_attention']`
and `['full_attention']`."""

from __future__ import annotations

from typing import Any, Mapping

from paxlike.errors import UserError
from paxlike.interop import gemma2, hf_fields, llama
from paxlike.interop.architecture import Architecture, NameMap
from paxlike.interop.rope_config import read_rope, rope_dict
from paxlike.layers import TransformerLM

# transformers 5 writes `_sliding_window_pattern` (the pattern it was built with) beside
# `layer_types`, and reads neither it nor `sliding_window_pattern` once `layer_types` is there.
KNOWN = gemma2.KNOWN | {'rope_local_base_freq', 'sliding_window_pattern', '_sliding_window_pattern'}
ALLOWED = gemma2.ALLOWED | {'qk_norm', 'local_rope_base'}
REQUIRED = {**gemma2.REQUIRED, 'qk_norm': True}


def tensor_names(model: TransformerLM) -> NameMap:
  return gemma2.tensor_names(model)


def _ropes(hf: Mapping[str, Any]) -> tuple[float, Any, float]:
  """(global base, global scaling, local base) from either layout."""
  nested = isinstance((hf.get('rope_parameters') or {}).get('sliding_attention'), Mapping)
  base, scaling = read_rope(hf, 'full_attention' if nested else None, 1_000_000.0)
  if not nested:
    return base, scaling, float(hf.get('rope_local_base_freq', 10_000.0))
  local_base, local_scaling = read_rope(hf, 'sliding_attention')
  if local_scaling is not None:
    raise UserError(f'config.json rope_parameters["sliding_attention"] scales RoPE '
                    f'({local_scaling.kind}); local layers are unscaled in paxlike')
  return base, scaling, local_base


def _global_every(hf: Mapping[str, Any]) -> int:
  """Every how many layers one is global (0: none is), from `layer_types` as transformers
  reads it, else from the pattern it would build them with (every 6th by default)."""
  kinds = hf.get('layer_types')
  if kinds is None:
    pattern = int(hf.get('sliding_window_pattern') or 6)
    kinds = ['full_attention' if (i + 1) % pattern == 0 else 'sliding_attention'
             for i in range(int(hf['num_hidden_layers']))]
  kinds = list(kinds)
  return kinds.index('full_attention') + 1 if 'full_attention' in kinds else 0


def model_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  hf_fields.check_keys(hf, KNOWN, 'gemma3_text')
  base, scaling, local_base = _ropes(hf)
  fields = {**gemma2.gemma_fields(hf, (None, None)), 'qk_norm': True, 'rope_base': base,
            'rope_scaling': scaling, 'local_rope_base': local_base,
            'global_every': _global_every(hf)}
  hf_fields.check_layer_types(hf, fields)
  return fields


def mismatches(model: TransformerLM) -> list[str]:
  out = hf_fields.unsupported(model, ALLOWED, REQUIRED)
  if not model.global_every:
    out.append('global_every=0 (Gemma 3 has global layers)')
  if model.rope_scaling is not None and model.local_rope_base is None:
    out.append('local_rope_base=None with rope_scaling (Gemma 3 local layers are unscaled)')
  return out


def hf_config(model: TransformerLM) -> dict[str, Any]:
  problems = mismatches(model)
  if problems:
    raise UserError(f'not a Gemma 3: {", ".join(problems)}')
  local_base = model.rope_base if model.local_rope_base is None else model.local_rope_base
  return {'architectures': ['Gemma3ForCausalLM'], 'model_type': 'gemma3_text',
          **gemma2.gemma_config(model), 'sliding_window_pattern': model.global_every,
          'rope_theta': model.rope_base, 'rope_local_base_freq': local_base,
          'rope_parameters': {'full_attention': rope_dict(model.rope_base, model.rope_scaling),
                              'sliding_attention': rope_dict(local_base, None)}}


ARCHITECTURE = Architecture(
    'gemma3_text', 'Gemma3ForCausalLM', model_fields, hf_config, tensor_names, mismatches)
