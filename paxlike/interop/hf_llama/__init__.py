"""Hugging Face Llama-style safetensors checkpoints ⇄ the paxlike `TransformerLM` param tree.

Names and layouts (HF `nn.Linear` weights are [out, in]; paxlike kernels are [in, out]):

    model.embed_tokens.weight              [V, d]      embed/embedding           [V, d]
    model.layers.{i}.self_attn.q_proj      [n·h, d]    block_{i}/attention/query [d, n, h]
    model.layers.{i}.self_attn.{k,v}_proj  [k·h, d]    .../attention/{key,value} [d, k, h]
    model.layers.{i}.self_attn.o_proj      [d, n·h]    .../attention/out         [n, h, d]
    model.layers.{i}.self_attn.{q,k}_norm  [h]         .../attention/{query,key}_norm/scale
    model.layers.{i}.mlp.{gate,up}_proj    [f, d]      .../mlp/{wi_gate,wi_up}/kernel [d, f]
    model.layers.{i}.mlp.down_proj         [d, f]      .../mlp/wo/kernel         [f, d]
    model.layers.{i}.input_layernorm       [d]         .../attn_norm/scale
    model.layers.{i}.post_attention_layernorm  [d]     .../mlp_norm/scale
    model.norm.weight                      [d]         final_norm/scale
    lm_head.weight                         [V, d]      lm_head/kernel            [d, V]

(every HF name ends in `.weight`). Rotary convention: HF Llama rotates each head by "rotate
half" (feature j pairs with j + h/2), and its conversion script already permuted Meta's
interleaved-pair q/k weights into that layout. paxlike's `apply_rope` uses the same rotate-half
layout and the same frequencies (base^(-2j/h)), so q/k weights map over with a plain reshape.
The q/k norms are Qwen-3 style (per head, before rope) and only present with `qk_norm=True`.
A scanned model (`scan_layers=True`) gets the layers stacked under 'blocks'. Mixture-of-experts
checkpoints (Mixtral, Qwen-MoE, DeepSeek, ...) and MoE models are refused by name: the experts'
layout is not mapped (`check_dense`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import fiddle as fdl
import jax
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file

from paxlike.families.shapes import abstract_params
from paxlike.errors import RunFailure, UserError
from paxlike.layers import TransformerLM
from paxlike.layers.transformer import stack_layers, unstack_layers
from paxlike.interop.hf_llama.checks import check_dense, check_model

Convert = Callable[[np.ndarray], np.ndarray]
# HF name -> (paxlike path in the unrolled tree, HF -> paxlike, paxlike -> HF).
NameMap = dict[str, tuple[tuple[str, ...], Convert, Convert]]

_T: Convert = lambda w: w.T
_ID: Convert = lambda w: w


def name_map(model: TransformerLM) -> NameMap:
  """Every HF tensor name of `model`'s checkpoint, with its paxlike path and converters."""
  check_model(model)
  d, n = model.d_model, model.num_heads
  kv, h = model.num_kv_heads or n, model.d_model // model.num_heads

  def in_proj(heads: int) -> tuple[Convert, Convert]:
    return (lambda w: w.T.reshape(d, heads, h)), (lambda p: p.reshape(d, heads * h).T)

  layer: dict[str, tuple[tuple[str, ...], Convert, Convert]] = {
      'self_attn.q_proj': (('attention', 'query'), *in_proj(n)),
      'self_attn.k_proj': (('attention', 'key'), *in_proj(kv)),
      'self_attn.v_proj': (('attention', 'value'), *in_proj(kv)),
      'self_attn.o_proj': (('attention', 'out'), lambda w: w.T.reshape(n, h, d),
                           lambda p: p.reshape(n * h, d).T),
      'mlp.gate_proj': (('mlp', 'wi_gate', 'kernel'), _T, _T),
      'mlp.up_proj': (('mlp', 'wi_up', 'kernel'), _T, _T),
      'mlp.down_proj': (('mlp', 'wo', 'kernel'), _T, _T),
      'input_layernorm': (('attn_norm', 'scale'), _ID, _ID),
      'post_attention_layernorm': (('mlp_norm', 'scale'), _ID, _ID),
  }
  if model.qk_norm:
    layer['self_attn.q_norm'] = (('attention', 'query_norm', 'scale'), _ID, _ID)
    layer['self_attn.k_norm'] = (('attention', 'key_norm', 'scale'), _ID, _ID)
  names: NameMap = {
      'model.embed_tokens.weight': (('embed', 'embedding'), _ID, _ID),
      'model.norm.weight': (('final_norm', 'scale'), _ID, _ID),
  }
  if not model.tied_embeddings:
    names['lm_head.weight'] = (('lm_head', 'kernel'), _T, _T)
  for i in range(model.num_layers):
    for suffix, (path, to_pax, to_hf) in layer.items():
      names[f'model.layers.{i}.{suffix}.weight'] = ((f'block_{i}', *path), to_pax, to_hf)
  return names


def _get(tree: Mapping[str, Any], path: tuple[str, ...]) -> Any:
  for key in path:
    tree = tree[key]
  return tree


def _set(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def import_params(tensors: Mapping[str, np.ndarray], model: TransformerLM) -> dict[str, Any]:
  """HF tensors -> the paxlike param tree of `model` (host numpy arrays in `model.param_dtype`).

  Every expected tensor must be present with the right shape and nothing else may be left
  over (a tied model accepts an `lm_head.weight` equal to the embedding); otherwise UserError.
  """
  names = name_map(model)
  unrolled = model.clone(scan_layers=False, parent=None)
  shapes = abstract_params(unrolled, seq_len=1)
  missing = sorted(set(names) - set(tensors))
  extra = sorted(set(tensors) - set(names))
  if model.tied_embeddings and 'lm_head.weight' in extra:
    if not np.array_equal(tensors['lm_head.weight'], tensors.get('model.embed_tokens.weight')):
      raise UserError('checkpoint has an lm_head.weight that differs from the embedding, '
                      'but the model ties them; set tied_embeddings=False')
    extra.remove('lm_head.weight')
  if missing or extra:
    raise UserError(f'checkpoint does not match the model: missing {missing[:3]} '
                    f'({len(missing)} in all), unexpected {extra[:3]} ({len(extra)} in all)')
  dtype = np.dtype(model.param_dtype)
  params: dict[str, Any] = {}
  for name, (path, to_pax, _) in names.items():
    value = to_pax(np.asarray(tensors[name]))
    expected = _get(shapes, path).shape
    if value.shape != expected:
      raise UserError(f'{name}: shape {tensors[name].shape} does not fit the model '
                      f'(paxlike {"/".join(path)} is {expected})')
    _set(params, path, np.ascontiguousarray(value, dtype=dtype))
  return stack_layers(params, model.num_layers) if model.scan_layers else params


def export_params(params: Mapping[str, Any], model: TransformerLM,
                  dtype: Any = None) -> dict[str, np.ndarray]:
  """The paxlike param tree of `model` -> HF tensors (in `dtype`, default the params' own)."""
  names = name_map(model)
  if 'blocks' in params:
    params = unstack_layers(dict(params))
  tensors = {}
  for name, (path, _, to_hf) in names.items():
    value = to_hf(np.asarray(_get(params, path)))
    tensors[name] = np.ascontiguousarray(value, dtype=dtype or value.dtype)
  return tensors


def config_from_hf(hf: Mapping[str, Any], **overrides: Any) -> fdl.Config[TransformerLM]:
  """A TransformerLM config equal to a HF LlamaConfig dict (config.json), plus `overrides`."""
  check_dense(hf)
  unsupported = {
      'rope_scaling': hf.get('rope_scaling') is not None,
      'attention_bias': bool(hf.get('attention_bias')),
      'mlp_bias': bool(hf.get('mlp_bias')),
      'hidden_act': hf.get('hidden_act', 'silu') != 'silu',
      'head_dim': hf.get('head_dim') not in (None, hf['hidden_size'] // hf['num_attention_heads']),
  }
  bad = [k for k, v in unsupported.items() if v]
  if bad:
    raise UserError(f'HF config uses {", ".join(bad)}={[hf.get(k) for k in bad]}, '
                    'which paxlike TransformerLM does not support')
  fields = dict(
      vocab_size=hf['vocab_size'],
      num_layers=hf['num_hidden_layers'],
      d_model=hf['hidden_size'],
      num_heads=hf['num_attention_heads'],
      num_kv_heads=hf.get('num_key_value_heads') or hf['num_attention_heads'],
      d_ff=hf['intermediate_size'],
      max_len=hf.get('max_position_embeddings', 2048),
      tied_embeddings=bool(hf.get('tie_word_embeddings', False)),
      rope_base=float(hf.get('rope_theta', 10_000.0)),
      norm_eps=float(hf.get('rms_norm_eps', 1e-6)),
      use_rmsnorm=True,
      gated_mlp=True,
      rope=True,
  )
  return fdl.Config(TransformerLM, **{**fields, **overrides})


def config_to_hf(model: TransformerLM) -> dict[str, Any]:
  """A HF LlamaConfig dict (config.json) for `model`."""
  check_model(model)
  return {
      'architectures': ['LlamaForCausalLM'],
      'model_type': 'llama',
      'vocab_size': model.vocab_size,
      'num_hidden_layers': model.num_layers,
      'hidden_size': model.d_model,
      'num_attention_heads': model.num_heads,
      'num_key_value_heads': model.num_kv_heads or model.num_heads,
      'head_dim': model.d_model // model.num_heads,
      'intermediate_size': model.d_ff,
      'max_position_embeddings': model.max_len,
      'tie_word_embeddings': model.tied_embeddings,
      'rope_theta': model.rope_base,
      'rms_norm_eps': model.norm_eps,
      'hidden_act': 'silu',
      'attention_bias': False,
      'mlp_bias': False,
  }


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
  """All tensors of a .safetensors file, or of every *.safetensors file in a directory."""
  path = Path(path)
  files = sorted(path.glob('*.safetensors')) if path.is_dir() else [path]
  if not files:
    raise UserError(f'no .safetensors files in {path}')
  tensors: dict[str, np.ndarray] = {}
  for file in files:
    tensors.update(load_file(file))
  return tensors


def load_hf_checkpoint(directory: str | Path,
                       **overrides: Any) -> tuple[fdl.Config[TransformerLM], dict[str, Any]]:
  """(model config, params) from a HF checkpoint dir (config.json + *.safetensors).

  `overrides` set model fields that don't change the params, e.g. `scan_layers=True` or
  `dtype=jnp.bfloat16`.
  """
  directory = Path(directory)
  config_file = directory / 'config.json'
  if not config_file.is_file():
    raise UserError(f'no config.json in {directory}')
  cfg = config_from_hf(json.loads(config_file.read_text()), **overrides)
  return cfg, import_params(read_safetensors(directory), fdl.build(cfg))


def save_hf_checkpoint(params: Mapping[str, Any], model: TransformerLM, directory: str | Path,
                       dtype: Any = None) -> None:
  """Writes `directory`/model.safetensors and config.json, loadable by HF LlamaForCausalLM."""
  directory = Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  tensors = export_params(params, model, dtype)
  save_file(tensors, str(directory / 'model.safetensors'), metadata={'format': 'pt'})
  hf = config_to_hf(model)
  hf['torch_dtype'] = {'float32': 'float32', 'bfloat16': 'bfloat16', 'float16': 'float16'}.get(
      str(next(iter(tensors.values())).dtype), 'float32')
  (directory / 'config.json').write_text(json.dumps(hf, indent=2) + '\n')


# Streaming import (train.init_from): shapes from the files' headers, then one tensor at a time.

def safetensors_header(directory: str | Path) -> dict[str, tuple[tuple[int, ...], Path]]:
  """Tensor name -> (shape, file) over every *.safetensors file in `directory`, from the files'
  headers alone. UserError without any; a file that is not safetensors is RunFailure naming it."""
  files = sorted(Path(directory).glob('*.safetensors'))
  if not files:
    raise UserError(f'no .safetensors files in {directory}')
  header = {}
  for file in files:
    try:
      with safe_open(file, framework='numpy') as f:
        header.update({name: (tuple(f.get_slice(name).get_shape()), file) for name in f.keys()})
    except (SafetensorError, OSError) as error:
      raise RunFailure(f'{file} is not a readable safetensors file ({error})') from None
  return header


def check_shapes(shapes: Mapping[str, tuple[int, ...]], model: TransformerLM) -> None:
  """UserError unless `shapes` (HF name -> shape) are exactly `model`'s tensors (a tied model
  may also have an lm_head.weight): names the missing and unexpected ones, or the first tensor
  whose shape differs, with both shapes."""
  names = name_map(model)
  missing = sorted(set(names) - set(shapes))
  tied = {'lm_head.weight'} if model.tied_embeddings else set()
  extra = sorted(set(shapes) - set(names) - tied)
  if missing or extra:
    raise UserError(f'checkpoint does not match the model: missing {missing[:3]} '
                    f'({len(missing)} in all), unexpected {extra[:3]} ({len(extra)} in all)')
  abstract = abstract_params(model.clone(scan_layers=False, parent=None), seq_len=1)
  for name, (path, _, to_hf) in names.items():
    want = tuple(jax.eval_shape(to_hf, _get(abstract, path)).shape)
    if tuple(shapes[name]) != want:
      raise UserError(f'{name} is {list(shapes[name])} in the checkpoint but the model needs '
                      f'{list(want)} (paxlike {"/".join(path)})')


def read_params(header: Mapping[str, tuple[tuple[int, ...], Path]], model: TransformerLM
                ) -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
  """(paxlike path in the unrolled tree, value in `model.param_dtype`) of each tensor of a
  checkpoint that `check_shapes` accepted, one tensor at a time (each file opened once)."""
  names, dtype = name_map(model), np.dtype(model.param_dtype)
  for file in sorted({file for _, file in header.values()}):
    try:
      with safe_open(file, framework='numpy') as f:
        for name in f.keys():
          if name in names:
            path, to_pax, _ = names[name]
            yield path, np.ascontiguousarray(to_pax(f.get_tensor(name)), dtype=dtype)
          elif not np.array_equal(f.get_tensor(name), _read(header, 'model.embed_tokens.weight')):
            raise UserError('checkpoint has an lm_head.weight that differs from the embedding, '
                            'but the model ties them; set tied_embeddings=False')
    except SafetensorError as error:
      raise RunFailure(f'{file} is not a readable safetensors file ({error})') from None


def _read(header: Mapping[str, tuple[tuple[int, ...], Path]], name: str) -> np.ndarray:
  with safe_open(header[name][1], framework='numpy') as f:
    return f.get_tensor(name)
