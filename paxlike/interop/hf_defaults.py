"""What each family's transformers config class fills in for a key its config.json omits (the
dataclass defaults of transformers 5.17's `<Family>Config`; tests/fixtures/hf_configs/<version>/
<model_type>/defaults/config.json holds what each class wrote given only the required keys).

Only constants are here. Defaults that transformers derives from other keys stay with the
reader: `head_dim` None -> hidden_size / num_attention_heads (Llama, Mistral, Mixtral, and
Qwen2, Phi-3, the MoE Qwens, whose classes have no head_dim), `num_key_value_heads` None ->
num_attention_heads (Llama, Phi-3), RoPE's theta per family (`read_rope`'s `default_theta`).
A key the file sets, even to null, is the file's: null is a value (Mistral's no window).
"""

from __future__ import annotations

from typing import Any, Mapping

_DENSE = {'rms_norm_eps': 1e-6, 'tie_word_embeddings': False, 'hidden_act': 'silu',
          'attention_dropout': 0.0}
_QWEN = {**_DENSE, 'max_position_embeddings': 32768, 'use_sliding_window': False,
         'sliding_window': 4096, 'max_window_layers': 28}
_GEMMA = {'rms_norm_eps': 1e-6, 'tie_word_embeddings': True, 'num_key_value_heads': 4,
          'head_dim': 256, 'hidden_activation': 'gelu_pytorch_tanh', 'sliding_window': 4096,
          'query_pre_attn_scalar': 256, 'attention_bias': False, 'attention_dropout': 0.0}
_ROUTER = {'output_router_logits': False, 'router_aux_loss_coef': 0.001}
_QWEN_MOE = {**_QWEN, **_ROUTER, 'decoder_sparse_step': 1, 'norm_topk_prob': False,
             'mlp_only_layers': []}

DEFAULTS: dict[str, dict[str, Any]] = {
    'llama': {**_DENSE, 'max_position_embeddings': 2048, 'attention_bias': False,
              'mlp_bias': False},
    'mistral': {**_DENSE, 'num_key_value_heads': 8, 'max_position_embeddings': 131072,
                'sliding_window': 4096},
    'qwen2': {**_QWEN, 'num_key_value_heads': 32},
    'qwen3': {**_QWEN, 'num_key_value_heads': 32, 'head_dim': 128, 'attention_bias': False},
    'gemma2': {**_GEMMA, 'max_position_embeddings': 8192, 'attn_logit_softcapping': 50.0,
               'final_logit_softcapping': 30.0},
    'gemma3_text': {**_GEMMA, 'max_position_embeddings': 131072, 'attn_logit_softcapping': None,
                    'final_logit_softcapping': None, 'use_bidirectional_attention': False},
    'phi3': {**_DENSE, 'rms_norm_eps': 1e-5, 'max_position_embeddings': 4096,
             'original_max_position_embeddings': 4096, 'sliding_window': None,
             'resid_pdrop': 0.0, 'embd_pdrop': 0.0},
    'mixtral': {**_DENSE, **_ROUTER, 'rms_norm_eps': 1e-5, 'num_key_value_heads': 8,
                'max_position_embeddings': 131072, 'sliding_window': None,
                'num_local_experts': 8, 'num_experts_per_tok': 2, 'router_jitter_noise': 0.0},
    'qwen2_moe': {**_QWEN_MOE, 'num_key_value_heads': 16, 'num_experts': 60,
                  'num_experts_per_tok': 4, 'moe_intermediate_size': 1408,
                  'shared_expert_intermediate_size': 5632, 'qkv_bias': True},
    'qwen3_moe': {**_QWEN_MOE, 'num_key_value_heads': 4, 'num_local_experts': 128,
                  'num_experts_per_tok': 8, 'moe_intermediate_size': 768,
                  'attention_bias': False},
}
# transformers' `attribute_map`: a key the class stores under another name.
ALIASES: dict[str, dict[str, str]] = {
    'mixtral': {'num_experts': 'num_local_experts'},
    'qwen3_moe': {'num_experts': 'num_local_experts'},
}


def filled(hf: Mapping[str, Any]) -> dict[str, Any]:
  """`hf` with each key it omits set to its family's config-class default (aliased keys under
  the name the class stores them by); an unknown model_type's dict is returned as it is."""
  model_type = hf.get('model_type')
  out = dict(hf)
  for alias, name in ALIASES.get(model_type, {}).items():
    if alias in out and name not in out:
      out[name] = out.pop(alias)
  return {**DEFAULTS.get(model_type, {}), **out}
