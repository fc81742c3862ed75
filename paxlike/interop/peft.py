"""PEFT LoRA adapter directories (adapter_config.json + adapter_model.safetensors, what PEFT's
`save_pretrained` writes) as paxlike LoRA params on the base they were trained on.

A PEFT LoRA on the linear layer `M` ([out, in] weight W) holds `M.lora_A.weight` A [r, in] and
`M.lora_B.weight` B [out, r] (keys prefixed 'base_model.model.'), and computes
W + s·B·A with s = lora_alpha / r (lora_alpha / sqrt(r) with `use_rslora`). paxlike's adapter
beside the kernel K [in..., out...] computes K + (lora_alpha / lora_rank)·a·b with a [in..., r]
and b [r, out...] (`paxlike.layers.lora`), so a = Aᵀ and b = Bᵀ reshaped to K's axes (every
family maps W to K by a transpose and a reshape), lora_rank = r and lora_alpha = s·r. A fused
HF layer (Phi-3's qkv_proj, gate_up_proj) shares its A among the parts it splits into; B's
rows split as W's do.

What has no paxlike LoRA counterpart is refused in one line naming the key: DoRA, trainable
copies of whole modules (modules_to_save), per-module ranks or alphas, some layers only,
LoRA biases, embedding adapters, expert weights, and any tensor that is not a lora_A/lora_B.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from safetensors import SafetensorError, safe_open

from paxlike.errors import UserError
from paxlike.interop.architecture import NameMap
from paxlike.interop.weight_files import ADAPTER as WEIGHTS
from paxlike.layers import lora

CONFIG = 'adapter_config.json'
KEY = re.compile(r'base_model\.model\.(.+)\.lora_([AB])\.weight')
# adapter_config.json keys whose non-default value paxlike's LoRA cannot express.
UNSUPPORTED = {'use_dora': (None, False), 'modules_to_save': (None, []),
               'rank_pattern': (None, {}), 'alpha_pattern': (None, {}),
               'layers_to_transform': (None, []), 'layer_replication': (None, []),
               'bias': (None, 'none'), 'lora_bias': (None, False),
               'fan_in_fan_out': (None, False), 'target_parameters': (None, []),
               'trainable_token_indices': (None, [], {}), 'use_qalora': (None, False),
               'alora_invocation_tokens': (None, [])}
# Inits after which the adapter is trained on a residual of its base (W - B·A at init), not on
# the base itself, unless PEFT converted it on saving (which writes init_lora_weights=true).
RESIDUAL_INITS = ('pissa', 'olora', 'corda', 'loftq')


@dataclasses.dataclass(frozen=True)
class Adapter:
  """A PEFT LoRA adapter as read from its directory: `modules` maps each adapted HF module
  (e.g. 'model.layers.0.self_attn.q_proj') to its (A shape, B shape)."""

  directory: Path
  config: dict[str, Any]
  rank: int
  alpha: float  # paxlike's lora_alpha: PEFT's scale times the rank.
  modules: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]


def is_adapter(directory: Path) -> bool:
  """A PEFT adapter directory: adapter_config.json and no model weights beside it (a copy of
  the base's config.json, which some trainers save with the adapter, does not make it one)."""
  return (directory / CONFIG).is_file() and not any(
      f.name != WEIGHTS for f in directory.glob('*.safetensors'))


def read_config(directory: Path) -> dict[str, Any]:
  """`directory`/adapter_config.json as a dict; UserError when unreadable or not an object."""
  try:
    config = json.loads((directory / CONFIG).read_text('utf-8'))
  except (OSError, ValueError) as error:
    raise UserError(f'{directory / CONFIG} is not a readable JSON file ({error})') from None
  if not isinstance(config, dict):
    raise UserError(f'{directory / CONFIG} does not hold a JSON object')
  return config


def describe(directory: Path, config: dict[str, Any]) -> str:
  """'DIR is a PEFT LORA adapter (r=.., lora_alpha=.., target_modules=..) for the base ..'."""
  return (f"{directory} is a PEFT {config.get('peft_type', 'adapter')} adapter "
          f"(r={config.get('r')}, lora_alpha={config.get('lora_alpha')}, target_modules="
          f"{config.get('target_modules')}) for the base {config.get('base_model_name_or_path')!r}")


def _check_config(directory: Path, config: dict[str, Any]) -> None:
  where = directory / CONFIG
  if config.get('peft_type') != 'LORA':
    raise UserError(f"{where}: peft_type={config.get('peft_type')!r} cannot be loaded; only "
                    "'LORA' adapters map onto paxlike's LoRA")
  init = config.get('init_lora_weights')
  residual = isinstance(init, str) and init.lower().startswith(RESIDUAL_INITS)
  for key, fine in (*UNSUPPORTED.items(), ('init_lora_weights', () if residual else (init,))):
    if key in config and config[key] not in fine:
      raise UserError(f'{where}: {key}={config[key]!r} has no paxlike LoRA counterpart (only '
                      'plain LoRA on every layer of the attention and MLP projections, one rank '
                      'and alpha, loads); merge it into its base with PEFT '
                      '(merge_and_unload().save_pretrained(DIR)) and pass hf:DIR')
  r, alpha = config.get('r'), config.get('lora_alpha')
  if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
    raise UserError(f'{where}: r={r!r} is not a positive integer')
  if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not alpha > 0:
    raise UserError(f'{where}: lora_alpha={alpha!r} is not a positive number')


def _shapes(file: Path) -> dict[str, tuple[int, ...]]:
  try:
    with safe_open(str(file), framework='numpy') as f:
      return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
  except (SafetensorError, OSError) as error:
    raise UserError(f'{file} is not a readable safetensors file ({error})') from None


def read_adapter(directory: Path) -> Adapter:
  """The adapter in `directory` from its config and its weights' header (no data read);
  UserError naming the key for anything that is not a plain LoRA of one rank."""
  config = read_config(directory)
  _check_config(directory, config)
  file = directory / WEIGHTS
  if not file.is_file():
    found = ' (adapter_model.bin, a pickle, is not read: save it with safe_serialization=True)' \
        if (directory / 'adapter_model.bin').is_file() else ''
    raise UserError(f'{directory}: no {WEIGHTS}{found}')
  rank, modules = config['r'], {}
  for key, shape in sorted(_shapes(file).items()):
    match = KEY.fullmatch(key)
    if match is None:
      raise UserError(f'{file}: {key} is not a LoRA lora_A/lora_B weight (DoRA magnitudes, '
                      'modules_to_save copies, biases and embedding adapters cannot be mapped)')
    module, side = match.groups()
    want = 'A [r, in]' if side == 'A' else 'B [out, r]'
    if len(shape) != 2 or shape[0 if side == 'A' else 1] != rank:
      raise UserError(f'{file}: {key} is {list(shape)}, not {want} with r={rank} '
                      f'({directory / CONFIG})')
    modules.setdefault(module, {})[side] = shape
  for module, sides in modules.items():
    if set(sides) != {'A', 'B'}:
      other = 'B' if 'A' in sides else 'A'
      raise UserError(f'{file}: base_model.model.{module}.lora_{other}.weight is missing')
  if not modules:
    raise UserError(f'{file} holds no LoRA weights')
  scale = config['lora_alpha'] / (math.sqrt(rank) if config.get('use_rslora') else rank)
  return Adapter(directory, config, rank, float(scale * rank),
                 {m: (s['A'], s['B']) for m, s in modules.items()})


def _adapter_name(path: tuple[str, ...]) -> tuple[str, ...]:
  """A kernel's path -> its adapter's path stem ('.../mlp/wi_gate/kernel' -> '.../mlp/wi_gate')."""
  return path[:-1] if path[-1] == 'kernel' else path


def _placements(adapter: Adapter, names: NameMap
                ) -> dict[str, tuple[tuple[str, ...], ...]]:
  """HF module -> the paxlike adapter path stems its A and B go to; UserError naming a module
  that is no linear layer of the base, or that paxlike adapts no kernel of (experts)."""
  out = {}
  for module in adapter.modules:
    t = names.get(f'{module}.weight')
    key = f'base_model.model.{module}.lora_A.weight'
    if t is None or t.row is not None:
      what = 'an expert row of a stacked kernel' if t is not None else \
          'no linear layer of the base'
      raise UserError(f'{adapter.directory / WEIGHTS}: {key} adapts {module}, {what}; paxlike '
                      f'LoRA adapts {", ".join(lora.ATTENTION_TARGETS + lora.MLP_TARGETS)}')
    stems = tuple(_adapter_name(p) for p in t.paths)
    if any(s[-1] not in lora.ATTENTION_TARGETS + lora.MLP_TARGETS for s in stems):
      raise UserError(f'{adapter.directory / WEIGHTS}: {key} adapts {module}, which paxlike '
                      f'LoRA does not ({", ".join(s[-1] for s in stems)})')
    out[module] = stems
  return out


def targets(adapter: Adapter, names: NameMap) -> tuple[str, ...]:
  """paxlike's `lora_targets` of the adapter on a base whose tensors are `names`."""
  found = {stem[-1] for stems in _placements(adapter, names).values() for stem in stems}
  return tuple(t for t in lora.ATTENTION_TARGETS + lora.MLP_TARGETS if t in found)


def check_model(adapter: Adapter, model: Any, names: NameMap) -> None:
  """UserError unless `model`'s LoRA fields are the adapter's (rank, targets, alpha / rank),
  saying what to set."""
  want = targets(adapter, names)
  spec = lora.LoraSpec.of(model)
  same_scale = math.isclose(spec.scale, adapter.alpha / adapter.rank, rel_tol=1e-6)
  if spec.rank == adapter.rank and set(spec.targets) == set(want) and same_scale:
    return
  raise UserError(
      f'{adapter.directory} is a LoRA of r={adapter.rank} (scale {adapter.alpha / adapter.rank:g}) '
      f'on {", ".join(want)}, but the model has lora_rank={spec.rank}, lora_alpha={spec.alpha}, '
      f'lora_targets={spec.targets}: pass --fdl_set=model.lora_rank={adapter.rank} '
      f'--fdl_set=model.lora_alpha={adapter.alpha!r} "--fdl_set=model.lora_targets={want!r}"')


def adapter_params(adapter: Adapter, names: NameMap, shapes: dict[str, tuple[int, ...]],
                   dtype: Any) -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
  """(path in the unrolled tree, value) of every adapter param the adapter holds, one module
  at a time. `shapes`: the model's adapter params ('block_0/attention/query_lora_a' -> shape);
  UserError naming the first that the adapter lacks or whose size differs."""
  placements = _placements(adapter, names)
  given = {'/'.join(s) + suffix for stems in placements.values() for s in stems
           for suffix in lora.SUFFIXES}
  missing, extra = sorted(set(shapes) - given), sorted(given - set(shapes))
  if extra:
    raise UserError(f'{adapter.directory / WEIGHTS} adapts paxlike {extra[0]}, which the model '
                    f'has no adapter for ({len(extra)} in all)')
  if missing:
    raise UserError(f'{adapter.directory / WEIGHTS} has no LoRA for paxlike {missing[0]} '
                    f'({len(missing)} in all): an adapter on some layers or modules only '
                    'cannot be loaded')
  file = adapter.directory / WEIGHTS
  with safe_open(str(file), framework='numpy') as f:
    for module, stems in sorted(placements.items()):
      key = f'base_model.model.{module}.lora_'
      a, b = f.get_tensor(key + 'A.weight'), f.get_tensor(key + 'B.weight')
      a_shapes = [shapes['/'.join(s) + '_lora_a'] for s in stems]
      b_shapes = [shapes['/'.join(s) + '_lora_b'] for s in stems]
      rows = [math.prod(s[1:]) for s in b_shapes]
      if any(math.prod(s[:-1]) != a.shape[1] for s in a_shapes) or sum(rows) != b.shape[0]:
        raise UserError(f'{file}: {key}A.weight {list(a.shape)} and B.weight {list(b.shape)} '
                        f'do not fit the base ({module}: in {math.prod(a_shapes[0][:-1])}, '
                        f'out {sum(rows)})')
      for stem, a_shape, b_shape, part in zip(stems, a_shapes, b_shapes,
                                              np.split(b, np.cumsum(rows)[:-1])):
        yield (*stem[:-1], stem[-1] + '_lora_a'), np.ascontiguousarray(
            a.T.reshape(a_shape), dtype=dtype)
        yield (*stem[:-1], stem[-1] + '_lora_b'), np.ascontiguousarray(
            part.T.reshape(b_shape), dtype=dtype)
