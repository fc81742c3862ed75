"""The one loading path and the one export path of every family: config.json <-> a
`TransformerLM` config, and safetensors <-> the paxlike param tree (whole, or streamed one
tensor at a time for `train.init_from='hf:DIR'`).

A family's `tensor_names` maps each HF tensor to the param(s) of the unrolled ('block_{i}')
tree it holds; a scanned model (`scan_layers=True`) gets its layers stacked under 'blocks'.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Collection, Iterator, Mapping

import fiddle as fdl
import jax
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file

from paxlike.errors import RunFailure, UserError
from paxlike.families.shapes import abstract_params
from paxlike.interop import hf_defaults
from paxlike.interop.architecture import NameMap, Tensor
from paxlike.interop.architectures import architecture_for_config, architecture_for_model
from paxlike.interop.weight_files import Header, read_header
from paxlike.layers import TransformerLM
from paxlike.layers.rope import RopeScaling
from paxlike.layers.transformer import stack_layers, unstack_layers

TIED = 'lm_head.weight'


def name_map(model: TransformerLM, model_type: str | None = None,
             have: Collection[str] | None = None) -> NameMap:
  """Every HF tensor of `model`'s checkpoint (as `model_type`, else the family it matches): of
  the checkpoint holding tensors `have` when given (its layout), else the one export writes."""
  arch = architecture_for_model(model, model_type)
  if have is not None and arch.import_names is not None:
    return arch.import_names(model, have)
  return arch.tensor_names(model)


def _get(tree: Mapping[str, Any], path: tuple[str, ...]) -> Any:
  for key in path:
    tree = tree[key]
  return tree


def _set(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _as_config(value: Any) -> Any:
  """A RopeScaling as a fdl.Config of it (a saved task config stays serialisable)."""
  if isinstance(value, RopeScaling):
    return fdl.Config(RopeScaling, **{f.name: getattr(value, f.name)
                                      for f in dataclasses.fields(value)})
  return value


def config_from_hf(hf: Mapping[str, Any], **overrides: Any) -> fdl.Config[TransformerLM]:
  """The TransformerLM config of a config.json dict (any registered family; a key it omits is
  its config class's default, `hf_defaults`), plus `overrides`."""
  arch = architecture_for_config(hf)
  fields = arch.model_fields(hf_defaults.filled(hf))
  return fdl.Config(TransformerLM, **{k: _as_config(v) for k, v in {**fields, **overrides}.items()})


def config_to_hf(model: TransformerLM, model_type: str | None = None) -> dict[str, Any]:
  """config.json for `model` as `model_type` (else the family it matches)."""
  return architecture_for_model(model, model_type).hf_config(model)


def _param(tree: Mapping[str, Any], t: Tensor, path: tuple[str, ...]) -> Any:
  """The value `t` holds of the param at `path`: the whole param, or its row `t.row`."""
  value = _get(tree, path)
  if t.row is None:
    return value
  if isinstance(value, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(value.shape[1:], value.dtype)
  return value[t.row]


def _rows(names: NameMap) -> dict[tuple[str, ...], int]:
  """How many row tensors each stacked param is made of."""
  counts: dict[tuple[str, ...], int] = {}
  for t in names.values():
    if t.row is not None:
      counts[t.paths[0]] = counts.get(t.paths[0], 0) + 1
  return counts


def _assembled(pairs: Iterator[tuple[Tensor, tuple[str, ...], np.ndarray]], names: NameMap
               ) -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
  """(path, whole value) of each param from (tensor, path, value) pairs, stacking the rows
  of a stacked param once they are all read."""
  counts, pending = _rows(names), {}
  for t, path, value in pairs:
    if t.row is None:
      yield path, value
      continue
    rows = pending.setdefault(path, {})
    rows[t.row] = value
    if len(rows) == counts[path]:
      del pending[path]
      yield path, np.stack([rows[i] for i in range(len(rows))])


def _check_names(have: set[str], names: NameMap, model: TransformerLM) -> None:
  missing = sorted(set(names) - have)
  tied = {TIED} if model.tied_embeddings else set()
  extra = sorted(have - set(names) - tied)
  if missing or extra:
    raise UserError(f'checkpoint does not match the model: missing {missing[:3]} '
                    f'({len(missing)} in all), unexpected {extra[:3]} ({len(extra)} in all)')


def check_shapes(shapes: Mapping[str, tuple[int, ...]], model: TransformerLM,
                 names: NameMap | None = None) -> None:
  """UserError unless `shapes` (HF name -> shape) are exactly `model`'s tensors (a tied model
  may also have an lm_head.weight): names the missing and unexpected ones, or the first tensor
  whose shape differs, with both shapes."""
  names = name_map(model) if names is None else names
  _check_names(set(shapes), names, model)
  abstract = abstract_params(model.clone(scan_layers=False, parent=None), seq_len=1)
  for name, t in names.items():
    want = tuple(jax.eval_shape(t.to_hf, *(_param(abstract, t, p) for p in t.paths)).shape)
    if tuple(shapes[name]) != want:
      raise UserError(f'{name} is {list(shapes[name])} in the checkpoint but the model needs '
                      f'{list(want)} (paxlike {", ".join("/".join(p) for p in t.paths)})')


def _check_tied(lm_head: np.ndarray, embedding: np.ndarray) -> None:
  if not np.array_equal(lm_head, embedding):
    raise UserError('checkpoint has an lm_head.weight that differs from the embedding, '
                    'but the model ties them; set tied_embeddings=False')


def import_params(tensors: Mapping[str, np.ndarray], model: TransformerLM,
                  model_type: str | None = None) -> dict[str, Any]:
  """HF tensors -> the paxlike param tree of `model` (host numpy arrays in `model.param_dtype`);
  UserError unless every tensor is there with its shape and nothing else."""
  names = name_map(model, model_type, tensors.keys())
  check_shapes({k: v.shape for k, v in tensors.items()}, model, names)
  if model.tied_embeddings and TIED in tensors:
    _check_tied(tensors[TIED], tensors['model.embed_tokens.weight'])
  dtype, params = np.dtype(model.param_dtype), {}
  pairs = ((t, path, value) for name, t in names.items()
           for path, value in zip(t.paths, t.to_pax(np.asarray(tensors[name]))))
  for path, value in _assembled(pairs, names):
    _set(params, path, np.ascontiguousarray(value, dtype=dtype))
  if not model.scan_layers:
    return params
  return stack_layers(params, model.num_layers, model.moe_every if model.num_experts else 1)


def export_params(params: Mapping[str, Any], model: TransformerLM, dtype: Any = None,
                  model_type: str | None = None) -> dict[str, np.ndarray]:
  """The paxlike param tree of `model` -> HF tensors (in `dtype`, default the params' own)."""
  names = name_map(model, model_type)
  if 'blocks' in params:
    params = unstack_layers(dict(params))
  tensors = {}
  for name, t in names.items():
    value = t.to_hf(*(np.asarray(_param(params, t, p)) for p in t.paths))
    tensors[name] = np.ascontiguousarray(value, dtype=dtype or value.dtype)
  return tensors


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
  """All tensors of a .safetensors file, or of the checkpoint in a directory (the files and
  tensors `weight_files.read_header` picks: the index's shards, else model.safetensors, ...)."""
  path = Path(path)
  if not path.is_dir():
    return load_file(path)
  header, tensors = read_header(path), {}
  for file in sorted({file for _, file in header.values()}):
    with safe_open(file, framework='numpy') as f:
      tensors.update({name: f.get_tensor(name) for name, (_, at) in header.items() if at == file})
  return tensors


def read_config(directory: str | Path) -> dict[str, Any]:
  """`directory`/config.json as a dict; UserError when absent or not JSON."""
  file = Path(directory) / 'config.json'
  if not file.is_file():
    raise UserError(f'no config.json in {directory}')
  try:
    return json.loads(file.read_text())
  except json.JSONDecodeError as error:
    raise UserError(f'{file} is not JSON ({error})') from None


def load_hf_checkpoint(directory: str | Path,
                       **overrides: Any) -> tuple[fdl.Config[TransformerLM], dict[str, Any]]:
  """(model config, params) from a HF checkpoint dir (config.json + *.safetensors).
  `overrides` set model fields that don't change the params, e.g. `scan_layers=True`."""
  hf = read_config(directory)
  cfg = config_from_hf(hf, **overrides)
  return cfg, import_params(read_safetensors(directory), fdl.build(cfg), hf['model_type'])


def save_hf_checkpoint(params: Mapping[str, Any], model: TransformerLM, directory: str | Path,
                       dtype: Any = None, model_type: str | None = None,
                       carried: Mapping[str, Any] = {}) -> None:
  """Writes `directory`/model.safetensors and config.json (`carried`: source keys that do not
  change the computation, e.g. token ids), loadable by transformers' AutoModelForCausalLM."""
  directory = Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  tensors = export_params(params, model, dtype, model_type)
  save_file(tensors, str(directory / 'model.safetensors'), metadata={'format': 'pt'})
  hf = {**carried, **config_to_hf(model, model_type)}
  hf['torch_dtype'] = {'float32': 'float32', 'bfloat16': 'bfloat16', 'float16': 'float16'}.get(
      str(next(iter(tensors.values())).dtype), 'float32')
  (directory / 'config.json').write_text(json.dumps(hf, indent=2) + '\n')


# Streaming import (train.init_from): shapes from the files' headers, then one tensor at a time.

def safetensors_header(directory: str | Path) -> dict[str, tuple[tuple[int, ...], Path]]:
  """Tensor name -> (shape, file) of the checkpoint in `directory`, from the files' headers
  alone (`weight_files.read_header`: which files and tensors, and what is refused)."""
  return read_header(directory)


def read_params(header: Header, model: TransformerLM, names: NameMap
                ) -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
  """(paxlike path in the unrolled tree, value in `model.param_dtype`) of each param of a
  checkpoint that `check_shapes` accepted, one tensor at a time (each file opened once)."""
  dtype = np.dtype(model.param_dtype)
  for path, value in _assembled(_read_tensors(header, names), names):
    yield path, np.ascontiguousarray(value, dtype=dtype)


def _read_tensors(header: Header, names: NameMap
                  ) -> Iterator[tuple[Tensor, tuple[str, ...], np.ndarray]]:
  """(tensor, path, value) of each param value in the files (each file opened once)."""
  for file in sorted({file for _, file in header.values()}):
    try:
      with safe_open(file, framework='numpy') as f:
        for name in sorted(n for n, (_, at) in header.items() if at == file):
          if name in names:
            t = names[name]
            for path, value in zip(t.paths, t.to_pax(f.get_tensor(name))):
              yield t, path, value
          else:
            _check_tied(f.get_tensor(name), _read(header, 'model.embed_tokens.weight'))
    except SafetensorError as error:
      raise RunFailure(f'{file} is not a readable safetensors file ({error})') from None


def _read(header: Header, name: str) -> np.ndarray:
  with safe_open(header[name][1], framework='numpy') as f:
    return f.get_tensor(name)
