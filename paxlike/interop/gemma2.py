"""model_type 'gemma2', and what Gemma 3 shares with it.

Gemma's layers differ from Llama's: RMSNorm scales by (1 + w); four norms per layer (input,
post-attention, pre- and post-feed-forward: the attention and MLP outputs are normed before
their residual adds); the embedding is scaled by sqrt(hidden_size); GeGLU with tanh GELU
(`hidden_activation`); softmax scale query_pre_attn_scalar^-0.5; attention scores and final
logits soft-capped (cap · tanh(x / cap)); layers alternate local (sliding window) and global,
every second one global. Tensors:

    model.layers.{i}.input_layernorm            .../attn_norm/scale
    model.layers.{i}.post_attention_layernorm   .../post_attn_norm/scale
    model.layers.{i}.pre_feedforward_layernorm  .../mlp_norm/scale
    model.layers.{i}.post_feedforward_layernorm .../post_mlp_norm/scale
(and Llama's attention and MLP names; the head is tied by default).
"""

from __future__ import annotations

from typing import Any, Mapping

from paxlike.errors import UserError
from paxlike.interop import hf_fields, llama
from paxlike.interop.architecture import Architecture, NameMap, single
from paxlike.interop.rope_config import read_rope, rope_config
from paxlike.layers import TransformerLM

KNOWN = {'hidden_act', 'hidden_activation', 'query_pre_attn_scalar', 'sliding_window',
         'final_logit_softcapping', 'attn_logit_softcapping', 'attention_bias',
         'attention_dropout', 'layer_types', 'sliding_window_size',
         'use_bidirectional_attention'}
ALLOWED = {'mlp_activation', 'head_dim', 'rope_scaling', 'sliding_window', 'global_every',
           'norm_weight_offset', 'sandwich_norm', 'scale_embeddings', 'query_scale',
           'attn_logit_softcap', 'final_logit_softcap'}
REQUIRED = {'norm_weight_offset': 1.0, 'sandwich_norm': True, 'scale_embeddings': True}


def tensor_names(model: TransformerLM) -> NameMap:
  norms = {'input_layernorm.weight': single(('attn_norm', 'scale')),
           'post_attention_layernorm.weight': single(('post_attn_norm', 'scale')),
           'pre_feedforward_layernorm.weight': single(('mlp_norm', 'scale')),
           'post_feedforward_layernorm.weight': single(('post_mlp_norm', 'scale'))}
  return llama.decoder_names(model, {**llama.attention_names(model), **llama.mlp_names(),
                                     **norms})


def gemma_fields(hf: Mapping[str, Any], softcaps: tuple[float | None, float | None]
                 ) -> dict[str, Any]:
  """The fields Gemma 2 and 3 read alike (`softcaps`: the family's defaults of the attention
  and final soft-caps, for a config that lacks them; transformers' other defaults too)."""
  hf_fields.refuse(hf, 'attention_bias', (False,))
  hf_fields.refuse(hf, 'attention_dropout', (0, 0.0))
  hf_fields.refuse(hf, 'use_bidirectional_attention', (False, None))  # Causal either way.
  fields = hf_fields.dense_fields(hf)
  scalar = hf.get('query_pre_attn_scalar', 256)
  window = hf.get('sliding_window', hf.get('sliding_window_size', 4096))
  keys = ('attn_logit_softcapping', 'final_logit_softcapping')
  softcaps = {k: None if hf.get(k, default) is None else float(hf.get(k, default))
              for k, default in zip(keys, softcaps)}
  return {**fields, 'tied_embeddings': bool(hf.get('tie_word_embeddings', True)),
          'mlp_activation': hf_fields.activation(
              hf, 'hidden_activation' if hf.get('hidden_activation') else 'hidden_act',
              'gelu_pytorch_tanh'),
          'norm_weight_offset': 1.0, 'sandwich_norm': True, 'scale_embeddings': True,
          'query_scale': None if scalar is None else float(scalar) ** -0.5,
          'sliding_window': None if window is None else int(window),
          'attn_logit_softcap': softcaps['attn_logit_softcapping'],
          'final_logit_softcap': softcaps['final_logit_softcapping']}


def gemma_config(model: TransformerLM) -> dict[str, Any]:
  """The config.json keys Gemma 2 and 3 write alike."""
  h = llama.head_dim(model)
  return {**hf_fields.dense_config(model),
          'hidden_activation': hf_fields.HF_ACTIVATION[model.mlp_activation or 'silu'],
          'query_pre_attn_scalar': h if model.query_scale is None else model.query_scale ** -2,
          'sliding_window': model.sliding_window,
          'attn_logit_softcapping': model.attn_logit_softcap,
          'final_logit_softcapping': model.final_logit_softcap,
          'layer_types': hf_fields.layer_types(model),
          'attention_bias': False, 'attention_dropout': 0.0}


def model_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  hf_fields.check_keys(hf, KNOWN, 'gemma2')
  base, scaling = read_rope(hf)
  fields = {**gemma_fields(hf, (50.0, 30.0)), 'rope_base': base, 'rope_scaling': scaling}
  fields['global_every'] = 2 if fields['sliding_window'] is not None else 0
  hf_fields.check_layer_types(hf, fields)
  return fields


def mismatches(model: TransformerLM) -> list[str]:
  out = hf_fields.unsupported(model, ALLOWED, REQUIRED)
  if model.sliding_window is not None and model.global_every != 2:
    out.append(f'global_every={model.global_every} (Gemma 2 alternates: 2)')
  return out


def hf_config(model: TransformerLM) -> dict[str, Any]:
  problems = mismatches(model)
  if problems:
    raise UserError(f'not a Gemma 2: {", ".join(problems)}')
  return {'architectures': ['Gemma2ForCausalLM'], 'model_type': 'gemma2', **gemma_config(model),
          **rope_config(model.rope_base, model.rope_scaling)}


ARCHITECTURE = Architecture('gemma2', 'Gemma2ForCausalLM', model_fields, hf_config, tensor_names,
                mismatches)
