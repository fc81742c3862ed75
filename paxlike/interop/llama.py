"""model_type 'llama' (Llama 1/2/3/3.1/3.2/3.3, SmolLM, TinyLlama), and the decoder tensor
names the other dense families build on.

Names and layouts (HF `nn.Linear` weights are [out, in]; paxlike kernels are [in, out]):

    model.embed_tokens.weight              [V, d]      embed/embedding           [V, d]
    model.layers.{i}.self_attn.q_proj      [n·h, d]    block_{i}/attention/query [d, n, h]
    model.layers.{i}.self_attn.{k,v}_proj  [k·h, d]    .../attention/{key,value} [d, k, h]
    model.layers.{i}.self_attn.o_proj      [d, n·h]    .../attention/out         [n, h, d]
    model.layers.{i}.self_attn.*_proj.bias             .../attention/{query,key,value,out}_bias
    model.layers.{i}.mlp.{gate,up}_proj    [f, d]      .../mlp/{wi_gate,wi_up}/kernel [d, f]
    model.layers.{i}.mlp.down_proj         [d, f]      .../mlp/wo/kernel         [f, d]
    model.layers.{i}.input_layernorm       [d]         .../attn_norm/scale
    model.layers.{i}.post_attention_layernorm  [d]     .../mlp_norm/scale
    model.norm.weight                      [d]         final_norm/scale
    lm_head.weight                         [V, d]      lm_head/kernel            [d, V]

Rotary convention: HF rotates each head by "rotate half" (feature j pairs with j + h/2), and its
conversion script already permuted Meta's interleaved-pair q/k weights into that layout, which
is paxlike's, so q/k weights map over with a plain reshape.
"""

from __future__ import annotations

from typing import Any, Mapping

from paxlike.errors import UserError
from paxlike.interop import hf_fields
from paxlike.interop.architecture import Architecture, NameMap, Tensor, single, transposed
from paxlike.interop.rope_config import read_rope, rope_config
from paxlike.layers import TransformerLM

KNOWN = {'hidden_act', 'attention_bias', 'attention_dropout', 'mlp_bias'}
ALLOWED = {'mlp_activation', 'head_dim', 'qkv_bias', 'out_bias', 'rope_scaling'}


def head_dim(model: TransformerLM) -> int:
  return model.head_dim or model.d_model // model.num_heads


def projection(model: TransformerLM, path: tuple[str, ...], heads: int) -> Tensor:
  """q/k/v_proj [heads·h, d] <-> kernel [d, heads, h]."""
  d, h = model.d_model, head_dim(model)
  return single(path, lambda w: w.T.reshape(d, heads, h), lambda p: p.reshape(d, heads * h).T)


def attention_names(model: TransformerLM) -> dict[str, Tensor]:
  """A layer's attention tensors (suffixes after 'model.layers.{i}.'), paths in the layer."""
  n, kv, h, d = model.num_heads, model.num_kv_heads or model.num_heads, head_dim(model), \
      model.d_model
  a = ('attention',)
  names = {
      'self_attn.q_proj.weight': projection(model, (*a, 'query'), n),
      'self_attn.k_proj.weight': projection(model, (*a, 'key'), kv),
      'self_attn.v_proj.weight': projection(model, (*a, 'value'), kv),
      'self_attn.o_proj.weight': single((*a, 'out'), lambda w: w.T.reshape(n, h, d),
                                        lambda p: p.reshape(n * h, d).T),
  }
  if model.qkv_bias:
    for hf, pax, heads in (('q', 'query', n), ('k', 'key', kv), ('v', 'value', kv)):
      names[f'self_attn.{hf}_proj.bias'] = single(
          (*a, f'{pax}_bias'), lambda b, heads=heads: b.reshape(heads, h),
          lambda p, heads=heads: p.reshape(heads * h))
  if model.out_bias:
    names['self_attn.o_proj.bias'] = single((*a, 'out_bias'))
  if model.qk_norm:
    names['self_attn.q_norm.weight'] = single((*a, 'query_norm', 'scale'))
    names['self_attn.k_norm.weight'] = single((*a, 'key_norm', 'scale'))
  return names


def mlp_names() -> dict[str, Tensor]:
  return {'mlp.gate_proj.weight': transposed(('mlp', 'wi_gate', 'kernel')),
          'mlp.up_proj.weight': transposed(('mlp', 'wi_up', 'kernel')),
          'mlp.down_proj.weight': transposed(('mlp', 'wo', 'kernel'))}


def norm_names() -> dict[str, Tensor]:
  return {'input_layernorm.weight': single(('attn_norm', 'scale')),
          'post_attention_layernorm.weight': single(('mlp_norm', 'scale'))}


def decoder_names(model: TransformerLM, layer: Mapping[str, Tensor]) -> NameMap:
  """Embedding, final norm, head (untied) and every layer's `layer` tensors."""
  names: NameMap = {'model.embed_tokens.weight': single(('embed', 'embedding')),
                    'model.norm.weight': single(('final_norm', 'scale'))}
  if not model.tied_embeddings:
    names['lm_head.weight'] = transposed(('lm_head', 'kernel'))
  for i in range(model.num_layers):
    for suffix, t in layer.items():
      names[f'model.layers.{i}.{suffix}'] = t._replace(
          paths=tuple((f'block_{i}', *p) for p in t.paths))
  return names


def tensor_names(model: TransformerLM) -> NameMap:
  return decoder_names(model, {**attention_names(model), **mlp_names(), **norm_names()})


def model_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  hf_fields.check_keys(hf, KNOWN, 'llama')
  hf_fields.refuse(hf, 'mlp_bias', (False,))
  hf_fields.refuse(hf, 'attention_dropout', (0, 0.0))
  base, scaling = read_rope(hf)
  bias = bool(hf.get('attention_bias', False))
  return {**hf_fields.dense_fields(hf), 'rope_base': base, 'rope_scaling': scaling,
          'qkv_bias': bias, 'out_bias': bias, 'mlp_activation': hf_fields.activation(hf)}


def mismatches(model: TransformerLM) -> list[str]:
  out = hf_fields.unsupported(model, ALLOWED)
  if model.qkv_bias != model.out_bias:
    out.append(f'qkv_bias={model.qkv_bias} with out_bias={model.out_bias} (Llama has both or '
               'neither)')
  return out


def hf_config(model: TransformerLM) -> dict[str, Any]:
  problems = mismatches(model)
  if problems:
    raise UserError(f'not a Llama: {", ".join(problems)}')
  return {'architectures': ['LlamaForCausalLM'], 'model_type': 'llama',
          **hf_fields.dense_config(model), **rope_config(model.rope_base, model.rope_scaling),
          'hidden_act': hf_fields.HF_ACTIVATION[model.mlp_activation or 'silu'],
          'attention_bias': model.qkv_bias, 'mlp_bias': False, 'attention_dropout': 0.0}


ARCHITECTURE = Architecture(
    'llama', 'LlamaForCausalLM', model_fields, hf_config, tensor_names, mismatches)
