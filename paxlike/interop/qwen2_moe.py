"""model_type 'qwen2_moe' (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's decoder (biases on q/k/v
by `qkv_bias`, none on o) with a sparse MoE block in every `decoder_sparse_step`-th layer:
`num_experts` SwiGLU experts of width `moe_intermediate_size` under a softmax top-k router (raw
weights unless `norm_topk_prob`), plus a shared expert of width
`shared_expert_intermediate_size` that every token runs, scaled by a sigmoid gate. The shared
parts are in `moe_family`.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

from paxlike.errors import UserError
from paxlike.interop import hf_fields, moe_family
from paxlike.interop.architecture import Architecture, NameMap
from paxlike.interop.rope_config import read_rope, rope_config
from paxlike.layers import TransformerLM

KNOWN = {'qkv_bias', 'shared_expert_intermediate_size', *moe_family.QWEN_KEYS}
ALLOWED = {'mlp_activation', 'rope_scaling', 'qkv_bias'}  # head_dim is d / heads there.


def model_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  hf_fields.check_keys(hf, KNOWN, 'qwen2_moe')
  shared = hf.get('shared_expert_intermediate_size')
  if isinstance(shared, bool) or not isinstance(shared, int) or shared < 1:
    raise UserError(f'config.json shared_expert_intermediate_size={shared!r} is not a positive '
                    'integer')
  d, heads = hf['hidden_size'], hf['num_attention_heads']
  if hf.get('head_dim') not in (None, d // heads):
    raise UserError(f'config.json head_dim={hf["head_dim"]!r} is not supported for model_type '
                    f"'qwen2_moe' (its attention uses hidden_size / num_attention_heads = "
                    f'{d // heads})')
  base, scaling = read_rope(hf)
  return {**hf_fields.dense_fields(hf), 'rope_base': base, 'rope_scaling': scaling,
          'qkv_bias': bool(hf.get('qkv_bias', True)), 'out_bias': False,
          'moe_shared_d_ff': shared, **moe_family.qwen_moe_fields(hf, 'qwen2_moe')}


def mismatches(model: TransformerLM) -> list[str]:
  out = moe_family.mismatches(model, ALLOWED, renormalize=None, shared=True, every=True)
  if model.num_experts and not model.moe_shared_d_ff:
    out.append('moe_shared_d_ff=0 (Qwen2-MoE has a shared expert)')
  return out


def hf_config(model: TransformerLM) -> dict[str, Any]:
  problems = mismatches(model)
  if problems:
    raise UserError(f'not a Qwen2-MoE: {", ".join(problems)}')
  return {'architectures': ['Qwen2MoeForCausalLM'], 'model_type': 'qwen2_moe',
          **hf_fields.dense_config(model), **rope_config(model.rope_base, model.rope_scaling),
          'qkv_bias': model.qkv_bias,
          'shared_expert_intermediate_size': model.moe_shared_d_ff,
          **moe_family.qwen_moe_config(model)}


def tensor_names(model: TransformerLM) -> NameMap:
  """The per-expert layout, the shared expert and its gate."""
  return moe_family.decoder_names(model, moe_family.qwen_expert_names(model))


def import_names(model: TransformerLM, have: Collection[str]) -> NameMap:
  """The layout of a checkpoint holding tensors `have` (per-expert or fused)."""
  return moe_family.decoder_names(model, moe_family.qwen_expert_names(model, have))


ARCHITECTURE = Architecture(
    'qwen2_moe', 'Qwen2MoeForCausalLM', model_fields, hf_config, tensor_names, mismatches,
    import_names)
