"""What the family modules share: reading a config.json dict strictly (every key either
honoured, harmless, or refused by name) and the TransformerLM features a model uses.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from paxlike.errors import UserError
from paxlike.layers import TransformerLM

# Keys that never change what the model computes (ids, bookkeeping, generation defaults).
HARMLESS = frozenset({
    'architectures', 'model_type', 'torch_dtype', 'dtype', 'transformers_version',
    '_name_or_path', 'bos_token_id', 'eos_token_id', 'pad_token_id', 'sep_token_id',
    'decoder_start_token_id', 'use_cache', 'initializer_range', 'return_dict',
    'output_hidden_states', 'output_attentions', 'torchscript', 'use_return_dict',
    'tokenizer_class', 'id2label', 'label2id', 'problem_type', 'task_specific_params',
    'finetuning_task', 'cache_implementation', 'max_length', 'min_length', 'do_sample',
    'temperature', 'top_k', 'top_p', 'num_beams', 'repetition_penalty', 'is_decoder',
    'add_cross_attention', 'tie_encoder_decoder', 'is_encoder_decoder', 'chunk_size_feed_forward',
    'pruned_heads', 'prefix', 'pretraining_tp', 'auto_map', 'keys_to_ignore_at_inference',
})
# Keys every dense family reads the same way (and must have, bar the defaulted ones).
REQUIRED = ('vocab_size', 'hidden_size', 'num_hidden_layers', 'num_attention_heads',
            'intermediate_size')
COMMON = frozenset({*REQUIRED, 'num_key_value_heads', 'max_position_embeddings',
                    'tie_word_embeddings', 'rms_norm_eps', 'rope_theta', 'rope_scaling',
                    'rope_parameters', 'head_dim'})
# HF activation names -> paxlike mlp_activation.
ACTIVATIONS = {'silu': 'silu', 'swish': 'silu', 'gelu_pytorch_tanh': 'gelu_tanh',
               'gelu_new': 'gelu_tanh', 'gelu': 'gelu_exact'}
# paxlike's 'gelu' is flax's default, the tanh approximation.
HF_ACTIVATION = {'silu': 'silu', 'gelu': 'gelu_pytorch_tanh', 'gelu_tanh': 'gelu_pytorch_tanh',
                 'gelu_exact': 'gelu'}


def check_keys(hf: Mapping[str, Any], known: Iterable[str], model_type: str) -> None:
  """UserError naming the missing required keys, or a key this family does not know."""
  missing = [k for k in REQUIRED if hf.get(k) is None]
  if missing:
    raise UserError(f'config.json of model_type {model_type!r} lacks {", ".join(missing)}')
  unknown = sorted(set(hf) - HARMLESS - COMMON - set(known))
  if unknown:
    raise UserError(f'config.json field {unknown[0]}={hf[unknown[0]]!r} is not supported for '
                    f'model_type {model_type!r}')


def refuse(hf: Mapping[str, Any], key: str, allowed: Iterable[Any]) -> None:
  """UserError naming `key` and its value unless it is absent or one of `allowed`."""
  if key in hf and hf[key] not in tuple(allowed):
    raise UserError(f'config.json {key}={hf[key]!r} is not supported '
                    f'(supported: {", ".join(map(repr, allowed))})')


def activation(hf: Mapping[str, Any], key: str = 'hidden_act',
               default: str = 'silu') -> str | None:
  """paxlike's mlp_activation for the config's HF activation name (None for SiLU, the gated
  MLP's default)."""
  name = hf.get(key) or default
  if name not in ACTIVATIONS:
    raise UserError(f'config.json {key}={name!r} is not supported (supported: '
                    f'{", ".join(ACTIVATIONS)})')
  return None if ACTIVATIONS[name] == 'silu' else ACTIVATIONS[name]


def dense_fields(hf: Mapping[str, Any]) -> dict[str, Any]:
  """The TransformerLM fields every dense family reads the same way."""
  d, n = int(hf['hidden_size']), int(hf['num_attention_heads'])
  head_dim = hf.get('head_dim')
  return dict(
      vocab_size=int(hf['vocab_size']), num_layers=int(hf['num_hidden_layers']), d_model=d,
      num_heads=n, num_kv_heads=int(hf.get('num_key_value_heads') or n),
      d_ff=int(hf['intermediate_size']), max_len=int(hf.get('max_position_embeddings', 2048)),
      tied_embeddings=bool(hf.get('tie_word_embeddings', False)),
      norm_eps=float(hf.get('rms_norm_eps', 1e-6)), use_rmsnorm=True, gated_mlp=True, rope=True,
      head_dim=None if head_dim in (None, d // n) else int(head_dim))


def dense_config(model: TransformerLM) -> dict[str, Any]:
  """The config.json keys every dense family writes the same way."""
  return {
      'vocab_size': model.vocab_size, 'num_hidden_layers': model.num_layers,
      'hidden_size': model.d_model, 'num_attention_heads': model.num_heads,
      'num_key_value_heads': model.num_kv_heads or model.num_heads,
      'head_dim': model.head_dim or model.d_model // model.num_heads,
      'intermediate_size': model.d_ff, 'max_position_embeddings': model.max_len,
      'tie_word_embeddings': model.tied_embeddings, 'rms_norm_eps': model.norm_eps,
  }


def features(model: TransformerLM) -> dict[str, Any]:
  """The computation-changing fields `model` sets away from a plain Llama's, by name."""
  d = model.d_model // model.num_heads
  used = {
      'use_rmsnorm': model.use_rmsnorm is False, 'gated_mlp': model.gated_mlp is False,
      'rope': model.rope is False, 'num_experts': model.num_experts > 0,
      'mlp_activation': model.mlp_activation not in (None, 'silu'),
      'head_dim': model.head_dim not in (None, d), 'qk_norm': model.qk_norm,
      'qkv_bias': model.qkv_bias, 'out_bias': model.out_bias,
      'rope_scaling': model.rope_scaling is not None,
      'sliding_window': model.sliding_window is not None, 'global_every': model.global_every > 0,
      'local_rope_base': model.local_rope_base is not None,
      'norm_weight_offset': model.norm_weight_offset != 0, 'sandwich_norm': model.sandwich_norm,
      'scale_embeddings': model.scale_embeddings, 'query_scale': model.query_scale is not None,
      'attn_logit_softcap': model.attn_logit_softcap is not None,
      'final_logit_softcap': model.final_logit_softcap is not None,
  }
  return {name: getattr(model, name) for name, on in used.items() if on}


def unsupported(model: TransformerLM, allowed: Iterable[str],
                required: Mapping[str, Any] = {}) -> list[str]:
  """'field=value' for each feature `model` uses outside `allowed`, and for each `required`
  field whose value differs."""
  used = features(model)
  out = [f'{k}={v!r}' for k, v in used.items() if k not in set(allowed)]
  out += [f'{k}={getattr(model, k)!r}' for k, v in required.items() if getattr(model, k) != v]
  return out


def layer_types(model: TransformerLM) -> list[str]:
  """transformers 5's `layer_types` of `model` ('sliding_attention' for its local layers)."""
  return ['sliding_attention' if model.sliding_window is not None and model.is_local_layer(i)
          else 'full_attention' for i in range(model.num_layers)]


def check_layer_types(hf: Mapping[str, Any], model_fields: Mapping[str, Any]) -> None:
  """UserError unless a config's `layer_types` (when present) is the pattern `model_fields`
  make (every `global_every`-th layer full, the rest sliding when there is a window)."""
  if hf.get('layer_types') is None:
    return
  model = TransformerLM(**{k: v for k, v in model_fields.items() if k in (
      'num_layers', 'sliding_window', 'global_every', 'local_rope_base')})
  if list(hf['layer_types']) != layer_types(model):
    raise UserError(f'config.json layer_types={hf["layer_types"]!r} is not the pattern paxlike '
                    f'builds ({layer_types(model)})')
