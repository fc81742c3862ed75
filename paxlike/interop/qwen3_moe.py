"""model_type 'qwen3_moe' (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's decoder (per-head q/k
RMSNorm, an explicit head_dim, optional `attention_bias` on q/k/v/o) with a sparse MoE block in
every `decoder_sparse_step`-th layer: `num_experts` SwiGLU experts of width
`moe_intermediate_size`, top-`num_experts_per_tok` of a softmax router, the weights renormalised
when `norm_topk_prob`. The shared parts (router, both expert layouts, the keys Qwen2-MoE reads
alike) are in `moe_family`.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

from paxlike.errors import UserError
from paxlike.interop import hf_fields, moe_family
from paxlike.interop.architecture import Architecture, NameMap
from paxlike.interop.rope_config import read_rope, rope_config
from paxlike.layers import TransformerLM

KNOWN = {'attention_bias', *moe_family.QWEN_KEYS}
ALLOWED = {'mlp_activation', 'head_dim', 'rope_scaling', 'qk_norm', 'qkv_bias', 'out_bias'}


def model_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  hf_fields.check_keys(hf, KNOWN, 'qwen3_moe')
  base, scaling = read_rope(hf)
  bias = bool(hf.get('attention_bias', False))
  return {**hf_fields.dense_fields(hf), 'rope_base': base, 'rope_scaling': scaling,
          'qk_norm': True, 'qkv_bias': bias, 'out_bias': bias,
          **moe_family.qwen_moe_fields(hf, 'qwen3_moe')}


def mismatches(model: TransformerLM) -> list[str]:
  out = moe_family.mismatches(model, ALLOWED, renormalize=None, every=True)
  if not model.qk_norm:
    out.append('qk_norm=False')
  if model.qkv_bias != model.out_bias:
    out.append(f'qkv_bias={model.qkv_bias} with out_bias={model.out_bias} (attention_bias is '
               'both or neither)')
  return out


def hf_config(model: TransformerLM) -> dict[str, Any]:
  problems = mismatches(model)
  if problems:
    raise UserError(f'not a Qwen3-MoE: {", ".join(problems)}')
  return {'architectures': ['Qwen3MoeForCausalLM'], 'model_type': 'qwen3_moe',
          **hf_fields.dense_config(model), **rope_config(model.rope_base, model.rope_scaling),
          'attention_bias': model.qkv_bias, **moe_family.qwen_moe_config(model)}


def tensor_names(model: TransformerLM) -> NameMap:
  """The per-expert layout (mlp.gate, mlp.experts.{e}.gate_proj/up_proj/down_proj)."""
  return moe_family.decoder_names(model, moe_family.qwen_expert_names(model))


def import_names(model: TransformerLM, have: Collection[str]) -> NameMap:
  """The layout of a checkpoint holding tensors `have` (per-expert or fused)."""
  return moe_family.decoder_names(model, moe_family.qwen_expert_names(model, have))


ARCHITECTURE = Architecture(
    'qwen3_moe', 'Qwen3MoeForCausalLM', model_fields, hf_config, tensor_names, mismatches,
    import_names)
