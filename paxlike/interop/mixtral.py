"""model_type 'mixtral' (Mixtral 8x7B, 8x22B): Mistral's decoder (GQA, RoPE with θ 1e6 by
default, an optional sliding window) with a sparse MoE block in every layer: `num_local_experts`
SwiGLU experts of width `intermediate_size`, each token sent to `num_experts_per_tok` of them by
a softmax router whose top-k weights are renormalised (`moe_family` has the router, the tensor
names of both expert layouts, and the training-loss keys).
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

from paxlike.errors import UserError
from paxlike.interop import hf_fields, moe_family
from paxlike.interop.architecture import Architecture, NameMap
from paxlike.interop.rope_config import read_rope, rope_config
from paxlike.layers import TransformerLM

KNOWN = {'hidden_act', 'sliding_window', 'attention_dropout', 'num_local_experts',
         'router_jitter_noise', *moe_family.ROUTER_KEYS}
ALLOWED = {'mlp_activation', 'head_dim', 'rope_scaling', 'sliding_window'}
PROJECTIONS = ('w1', 'w3', 'w2')  # gate, up, down.


def model_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  hf_fields.check_keys(hf, KNOWN, 'mixtral')
  hf_fields.refuse(hf, 'attention_dropout', (0, 0.0))
  hf_fields.refuse(hf, 'router_jitter_noise', (0, 0.0))  # Training noise on the router input.
  base, scaling = read_rope(hf, default_theta=1e6)
  window = hf.get('sliding_window')
  if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                             or window < 1):
    raise UserError(f'config.json sliding_window={window!r} is not a positive integer or null')
  return {**hf_fields.dense_fields(hf), 'rope_base': base, 'rope_scaling': scaling,
          'mlp_activation': hf_fields.activation(hf), 'sliding_window': window,
          **moe_family.router_fields(hf, 'num_local_experts', renormalize=True)}


def mismatches(model: TransformerLM) -> list[str]:
  return moe_family.mismatches(model, ALLOWED, renormalize=True)


def hf_config(model: TransformerLM) -> dict[str, Any]:
  problems = mismatches(model)
  if problems:
    raise UserError(f'not a Mixtral: {", ".join(problems)}')
  return {'architectures': ['MixtralForCausalLM'], 'model_type': 'mixtral',
          **hf_fields.dense_config(model), **rope_config(model.rope_base, model.rope_scaling),
          'intermediate_size': model.moe_d_ff or model.d_ff,
          'hidden_act': hf_fields.HF_ACTIVATION[model.mlp_activation or 'silu'],
          'sliding_window': model.sliding_window, 'attention_dropout': 0.0,
          'num_local_experts': model.num_experts, 'router_jitter_noise': 0.0,
          **moe_family.router_config(model)}


def tensor_names(model: TransformerLM) -> NameMap:
  """The per-expert layout (block_sparse_moe.gate, block_sparse_moe.experts.{e}.w1/w3/w2)."""
  return moe_family.decoder_names(
      model, moe_family.expert_names(model, 'block_sparse_moe', PROJECTIONS))


def import_names(model: TransformerLM, have: Collection[str]) -> NameMap:
  """The layout of a checkpoint holding tensors `have`: per-expert, or transformers 5's fused
  one (mlp.gate, mlp.experts.gate_up_proj, mlp.experts.down_proj)."""
  if moe_family.is_fused(have):
    return moe_family.decoder_names(model, moe_family.fused_expert_names(model))
  return tensor_names(model)


ARCHITECTURE = Architecture('mixtral', 'MixtralForCausalLM', model_fields, hf_config, tensor_names,
                mismatches, import_names)
