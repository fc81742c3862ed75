"""RoPE settings in a config.json, in both layouts, read into (`rope_base`, `RopeScaling`) and
written back.

- transformers 4: top-level `rope_theta` and a `rope_scaling` dict (its kind under `rope_type`
  or the older `type`), or null.
- transformers 5: a `rope_parameters` dict holding `rope_theta`, `rope_type` and the scaling's
  fields; with per-layer RoPE (Gemma 3) one such dict per layer type ('full_attention',
  'sliding_attention').
A key of the scaling dict that changes the computation and is not honoured is refused by name.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from paxlike.errors import UserError
from paxlike.layers.rope import RopeScaling

# Per kind: the keys its dict may hold besides rope_type/type/rope_theta.
_KEYS = {
    'default': set(),
    'linear': {'factor'},
    'dynamic': {'factor', 'original_max_position_embeddings'},
    'yarn': {'factor', 'original_max_position_embeddings', 'attention_factor', 'beta_fast',
             'beta_slow', 'mscale', 'mscale_all_dim', 'truncate'},
    'llama3': {'factor', 'low_freq_factor', 'high_freq_factor',
               'original_max_position_embeddings'},
    'longrope': {'factor', 'short_factor', 'long_factor', 'attention_factor',
                 'original_max_position_embeddings'},
}


def _rope_dict(hf: Mapping[str, Any], layer_type: str | None) -> tuple[str, dict[str, Any]]:
  """(where it was found, the RoPE dict with rope_theta filled in) of `layer_type` (None: the
  model's one RoPE)."""
  params = hf.get('rope_parameters')
  if params:
    where = 'rope_parameters'
    if layer_type is not None and isinstance(params.get(layer_type), Mapping):
      params, where = params[layer_type], f'rope_parameters[{layer_type!r}]'
    elif any(isinstance(v, Mapping) for v in params.values()):
      raise UserError(f'config.json rope_parameters has per-layer entries '
                      f'{sorted(params)} this family does not use')
    # A top-level rope_theta (older readers' key) is the global layers' base.
    top = hf.get('rope_theta') if layer_type in (None, 'full_attention') else None
    if top is not None and 'rope_theta' in params and float(top) != float(params['rope_theta']):
      raise UserError(f'config.json has rope_theta={top} and {where}.rope_theta='
                      f'{params["rope_theta"]}: they disagree')
    _check_agrees(hf.get('rope_scaling') if layer_type in (None, 'full_attention') else None,
                  params, where)
    return where, {'rope_theta': top, **params}  # rope_parameters' own theta wins.
  return 'rope_scaling', {**(hf.get('rope_scaling') or {}), 'rope_theta': hf.get('rope_theta')}


def _check_agrees(old: Mapping[str, Any] | None, params: Mapping[str, Any], where: str) -> None:
  """UserError when a config holds both layouts and its transformers-4 `rope_scaling` says
  another kind or factor than `params` (which transformers 5 would read)."""
  if not old:
    return
  kind = lambda d: d.get('rope_type', d.get('type', 'default'))
  if kind(old) != kind(params) or old.get('factor') != params.get('factor'):
    raise UserError(f'config.json has rope_scaling={dict(old)} and {where} of rope_type '
                    f'{kind(params)!r}, factor {params.get("factor")}: they disagree')


def _float(value: Any, name: str, where: str) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise UserError(f'config.json {where}.{name}={value!r} is not a number')
  return float(value)


def _mscale(scale: float, m: float = 1.0) -> float:
  return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def read_rope(hf: Mapping[str, Any], layer_type: str | None = None,
              default_theta: float = 10_000.0) -> tuple[float, RopeScaling | None]:
  """(rope_base, scaling or None) of a config.json dict, in either layout."""
  where, d = _rope_dict(hf, layer_type)
  kind = d.get('rope_type', d.get('type', 'default'))
  base = _float(d['rope_theta'], 'rope_theta', where) if d.get('rope_theta') is not None \
      else default_theta
  if kind not in _KEYS:
    raise UserError(f'config.json {where}.rope_type={kind!r} is not supported (supported: '
                    f'{", ".join(sorted(_KEYS))})')
  extra = set(d) - _KEYS[kind] - {'rope_type', 'type', 'rope_theta', 'partial_rotary_factor'}
  if extra:
    name = sorted(extra)[0]
    raise UserError(f'config.json {where}.{name}={d[name]!r} is not supported with rope_type '
                    f'{kind!r}')
  partial = d.get('partial_rotary_factor', hf.get('partial_rotary_factor', 1.0))
  if partial not in (None, 1, 1.0):
    raise UserError(f'config.json partial_rotary_factor={partial} is not supported (1.0 only)')
  if kind == 'default':
    return base, None
  return base, _scaling(kind, d, hf, base, where)


def _scaling(kind: str, d: Mapping[str, Any], hf: Mapping[str, Any], base: float,
             where: str) -> RopeScaling:
  max_len = int(hf.get('max_position_embeddings') or 0)
  original = int(hf.get('original_max_position_embeddings')
                 or d.get('original_max_position_embeddings') or max_len)
  factor = d.get('factor')
  if factor is None and kind in ('yarn', 'longrope') and original:
    factor = max_len / original
  if factor is None:
    raise UserError(f'config.json {where} of rope_type {kind!r} has no factor')
  factor = _float(factor, 'factor', where)
  if not factor > 0:  # Frequencies divided by it: infinite or negative at <= 0.
    raise UserError(f'config.json {where}.factor={factor} is not positive (rope_type {kind!r})')
  if kind == 'linear':
    return RopeScaling('linear', factor)
  if kind == 'dynamic':
    return RopeScaling('dynamic', factor, original_max_len=max_len)
  if kind == 'llama3':
    return RopeScaling('llama3', factor, original,
                       low_freq_factor=_float(d.get('low_freq_factor'), 'low_freq_factor', where),
                       high_freq_factor=_float(d.get('high_freq_factor'), 'high_freq_factor',
                                               where))
  attention = d.get('attention_factor')
  if kind == 'yarn':
    if attention is None:
      m, m_all = d.get('mscale'), d.get('mscale_all_dim')
      attention = _mscale(factor, m) / _mscale(factor, m_all) if m and m_all else _mscale(factor)
    return RopeScaling('yarn', factor, original, beta_fast=float(d.get('beta_fast') or 32),
                       beta_slow=float(d.get('beta_slow') or 1),
                       attention_factor=float(attention), truncate=bool(d.get('truncate', True)))
  if attention is None:
    attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
  short, long = tuple(map(float, d['short_factor'])), tuple(map(float, d['long_factor']))
  return RopeScaling('longrope', factor, original, attention_factor=float(attention),
                     short_factor=short, long_factor=long)


def rope_dict(base: float, scaling: RopeScaling | None) -> dict[str, Any]:
  """The transformers-5 RoPE dict (`rope_parameters`, or one layer type's entry of it)."""
  out: dict[str, Any] = {'rope_type': scaling.kind if scaling else 'default', 'rope_theta': base}
  if scaling is None:
    return out
  out['factor'] = scaling.factor
  if scaling.kind in ('llama3', 'yarn', 'longrope'):
    out['original_max_position_embeddings'] = scaling.original_max_len
  if scaling.kind == 'llama3':
    out |= {'low_freq_factor': scaling.low_freq_factor,
            'high_freq_factor': scaling.high_freq_factor}
  if scaling.kind == 'yarn':
    out |= {'beta_fast': scaling.beta_fast, 'beta_slow': scaling.beta_slow,
            'attention_factor': scaling.attention_factor, 'truncate': scaling.truncate}
  if scaling.kind == 'longrope':
    out |= {'attention_factor': scaling.attention_factor,
            'short_factor': list(scaling.short_factor), 'long_factor': list(scaling.long_factor)}
  return out


def rope_config(base: float, scaling: RopeScaling | None) -> dict[str, Any]:
  """config.json's RoPE keys for one RoPE: `rope_parameters` (transformers 5) and the
  top-level `rope_theta` and `rope_scaling` transformers 4 reads (the same values)."""
  params = rope_dict(base, scaling)
  old = {k: v for k, v in params.items() if k != 'rope_theta'} if scaling else None
  return {'rope_theta': base, 'rope_scaling': old, 'rope_parameters': params}
