"""Task configs as data: overrides, safe JSON round-trips, and comparison with a job dir's run.

Loading a serialized config imports only modules on an allow-list (no pickle anywhere; see
allow_list.py), so a config file cannot run arbitrary code.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import json
from pathlib import Path
import typing
from typing import Any, Iterable

import fiddle as fdl
import jax.numpy as jnp
from absl import logging
from fiddle import daglish
from fiddle.experimental import serialization

from paxlike.errors import UserError
from paxlike.config import allow_list
from paxlike.config.allow_list import DTYPES
from paxlike.core import optim

# Fields that may change between runs in one job dir: the intervals, so a finished run can be
# extended, and the mesh, since checkpoints restore onto any mesh (the math is the same).
RESUMABLE_FIELDS = ('.train.num_steps', '.train.log_every', '.train.eval_every',
                    '.train.checkpoint_every', '.mesh.')
# The train settings that only the loop reads: how long and how often, and what it keeps.
LOOP_FIELDS = ('num_steps', 'log_every', 'eval_every', 'checkpoint_every', 'max_to_keep')


def parse_override(text: str) -> tuple[str, Any]:
  """`'model.num_layers=2'` → `('model.num_layers', 2)`. Non-literals are taken as strings."""
  path, sep, raw = text.partition('=')
  path = path.strip()
  if not sep or not path or not all(part.isidentifier() for part in path.split('.')):
    raise UserError(f'--fdl_set={text!r} is not PATH=VALUE (e.g. train.num_steps=200)')
  try:
    return path, ast.literal_eval(raw.strip())
  except (ValueError, SyntaxError):
    if any(c in raw for c in '()[]{},\'"'):
      raise UserError(f'--fdl_set {path}: cannot parse value {raw!r}') from None
    return path, raw.strip()


def _same_kind(old: Any, new: Any) -> bool:
  if old is None or isinstance(old, fdl.Buildable):
    return True
  if isinstance(old, bool) or isinstance(new, bool):
    return isinstance(old, bool) and isinstance(new, bool)
  if isinstance(old, float):
    return isinstance(new, (int, float))
  if isinstance(old, (tuple, list)):
    return isinstance(new, (tuple, list))
  return isinstance(new, type(old))


def _annotation_admits(buildable: fdl.Buildable, name: str, value: Any) -> bool:
  """Whether the configured function's or class's annotation of `name` admits `value` (e.g.
  `files: str | Sequence[str]` a string where the default is a tuple, or None in `int | None`)."""
  try:
    hint = typing.get_type_hints(buildable.__fn_or_cls__).get(name)
  except Exception:  # Unresolvable annotations: fall back to the value-kind check.
    return False
  for option in typing.get_args(hint) or (hint,):
    kind = typing.get_origin(option) or option
    if isinstance(kind, type) and isinstance(value, kind) and not (
        isinstance(value, bool) and kind is not bool):
      return True
  return False


def _is_dtype(value: Any) -> bool:
  return any(value is getattr(jnp, name) for name in DTYPES)


def _dtype_named(path: str, name: str) -> Any:
  if name not in DTYPES:
    raise UserError(f'--fdl_set {path}={name}: expected one of {", ".join(DTYPES)}')
  return getattr(jnp, name)


def _config_at(cfg: fdl.Buildable, path: list[daglish.PathElement]) -> Any:
  """The value at `path` under `cfg`, where a dataclass record left at its default (e.g.
  `TextData.fields`) becomes a config of that record, so an override can set one field of it."""
  value = cfg
  for element in path:
    child = element.follow(value)
    if (isinstance(value, fdl.Buildable) and isinstance(element, daglish.Attr)
        and dataclasses.is_dataclass(child) and not isinstance(child, type)):
      defaults = {f.name: f.default for f in dataclasses.fields(child)}
      child = fdl.Config(type(child), **{name: getattr(child, name) for name in defaults
                                         if getattr(child, name) != defaults[name]})
      setattr(value, element.name, child)
    value = child
  return value


def moved_path(cfg: fdl.Buildable, path: str) -> str | None:
  """The path a field renamed since `path` was written has now (allow_list.MOVED_ARGUMENTS, the
  table saved configs load through: TextData's `data.client_field` is `data.fields.client_field`),
  or None where `path` names no moved field."""
  *parents, name = path.split('.')
  try:
    parent = daglish.follow_path(cfg, daglish.parse_path('.' + '.'.join(parents))) if (
        parents) else cfg
  except (AttributeError, KeyError, IndexError, TypeError, ValueError):
    return None
  if not isinstance(parent, fdl.Buildable):
    return None
  field = allow_list.moved_argument(fdl.get_callable(parent), name)
  return None if field is None else '.'.join([*parents, field, name])


def _field_at(cfg: fdl.Buildable, path: str) -> tuple[str, Any, str, Any]:
  """(path, parent config, field name, current value) of the field `path` sets: a renamed
  field's new path (`moved_path`, noted in a warning), UserError for no field at all."""
  for attempt in (path, moved_path(cfg, path)):
    if attempt is None:
      break
    *parents, last = daglish.parse_path('.' + attempt)
    try:
      parent = _config_at(cfg, parents)
      old = getattr(parent, last.name)
    except (AttributeError, KeyError, TypeError, ValueError):
      continue
    if attempt != path:
      logging.warning('--fdl_set %s: this field is %s now', path, attempt)
    return attempt, parent, last.name, old
  raise UserError(f'--fdl_set {path}: no such field in the config')


def apply_overrides(cfg: fdl.Buildable, overrides: Iterable[str]) -> None:
  """Sets each `PATH=VALUE` on `cfg`, checking the path exists and the value's type fits; a
  renamed field's old path sets its new one (`moved_path`)."""
  for text in overrides:
    path, value = parse_override(text)
    path, parent, name, old = _field_at(cfg, path)
    if not isinstance(parent, fdl.Buildable):
      raise UserError(f'--fdl_set {path}: {path.rsplit(".", 1)[0]} is not a config')
    if _is_dtype(old) and isinstance(value, str):
      value = _dtype_named(path, value)
    if not (_same_kind(old, value) or _annotation_admits(parent, name, value)):
      raise UserError(f'--fdl_set {path}={value!r}: expected a {type(old).__name__} like {old!r}')
    setattr(parent, name, tuple(value) if isinstance(value, list) else value)


def with_run_lengths(cfg: fdl.Buildable) -> fdl.Buildable:
  """A copy of `cfg` in which each schedule that leaves its length unset (the presets do; see
  `optim.RUN_LENGTH_ARGS`) runs for `train.num_steps`, so an override of the steps moves the
  decay with it. The saved config.json keeps them unset; builds and config.txt use this."""
  num_steps = getattr(getattr(cfg, 'train', None), 'num_steps', None)
  if num_steps is None:
    return cfg
  cfg = copy.deepcopy(cfg)
  for value, _ in daglish.iterate(cfg):
    if isinstance(value, fdl.Buildable):
      arg = optim.RUN_LENGTH_ARGS.get(fdl.get_callable(value))
      if arg and arg not in value.__arguments__:
        setattr(value, arg, num_steps)
  return cfg


def build(cfg: fdl.Buildable) -> Any:
  """`fdl.build` of `with_run_lengths(cfg)`, turning config errors into one-line UserErrors.
  The train settings are checked first: the run lengths derive from them."""
  try:
    if isinstance(getattr(cfg, 'train', None), fdl.Buildable):
      fdl.build(cfg.train)
    return fdl.build(with_run_lengths(cfg))
  except UserError as error:
    raise UserError(error.args[0]) from None
  except (TypeError, ValueError) as error:
    raise UserError(f'invalid config: {str(error.args[0] if error.args else error).splitlines()[0]}') from None


def to_json(cfg: fdl.Buildable) -> str:
  return serialization.dump_json(cfg, indent=2)


def trace_key(cfg: fdl.Buildable) -> str:
  """What of `cfg` a run's programs are made from: its JSON with the run lengths filled in
  (`with_run_lengths`: a schedule's length is in its programs) and the loop's intervals, which
  no program reads, left out (a run extended by --fdl_set=train.num_steps keeps its programs)."""
  cfg = with_run_lengths(cfg)
  if isinstance(getattr(cfg, 'train', None), fdl.Buildable):
    cfg = copy.deepcopy(cfg)
    for name in LOOP_FIELDS:
      if name in cfg.train.__arguments__:
        delattr(cfg.train, name)
  return to_json(cfg)


def to_text(cfg: fdl.Buildable) -> str:
  """`path = value` per set field (run lengths filled in: `with_run_lengths`); `path.<fn>` names
  what each sub-config builds."""
  return ''.join(f'{path.lstrip(".") or "<root>"} = {value}\n'
                 for path, value in flatten(with_run_lengths(cfg)).items())


class StaleConfig(UserError):
  """A well-formed serialized config that names what this version of paxlike no longer has."""


def from_json(text: str, source: str, allow: Iterable[str] = ()) -> fdl.Buildable:
  """Loads a serialized config, importing only allow-listed modules. StaleConfig when it names a
  module or function that no longer exists (renamed or removed since it was saved)."""
  try:
    document = allow_list.with_moved_modules(json.loads(text))
  except json.JSONDecodeError as error:
    raise UserError(f'{source} is not valid JSON ({error.msg} at line {error.lineno})') from None
  refs = sorted(set(allow_list.pyrefs(document)))
  for module in sorted({module for module, _ in refs}):
    if not allow_list.is_allowed(module, allow):
      raise UserError(f'{source} imports {module!r}, which is not allowed; '
                      f'pass --allow_import={module.split(".")[0]} if you trust it')
  resolved = {(module, name): allow_list.resolve_ref(module, name) for module, name in refs}
  missing = [f'{module}.{name}' for (module, name), (found, _) in resolved.items() if not found]
  if missing:
    raise StaleConfig(f'{source} names {", ".join(missing)}, which this version of paxlike '
                      'does not have (renamed or removed since it was saved)')
  for (module, name), (_, obj) in resolved.items():
    why = allow_list.refusal(obj, allow)
    if why:
      raise UserError(f'{source} names {module}.{name}, which a config may not use ({why})')
  try:
    cfg = serialization.load_json(json.dumps(document))
  except Exception as error:  # Fiddle raises many kinds for malformed documents.
    raise UserError(f'{source} is not a valid serialized config ({type(error).__name__})') from None
  return with_moved_arguments(cfg)


def with_moved_arguments(cfg: fdl.Buildable) -> fdl.Buildable:
  """`cfg` with the arguments of allow_list.MOVED_ARGUMENTS set on their new record."""
  buildables = [value for value, _ in daglish.iterate(cfg) if isinstance(value, fdl.Buildable)]
  for value in buildables:
    fn = fdl.get_callable(value)
    key = (fn.__module__, fn.__qualname__) if isinstance(fn, type) else None
    if key not in allow_list.MOVED_ARGUMENTS:
      continue
    field, (module, name), names = allow_list.MOVED_ARGUMENTS[key]
    moved = {n: value.__arguments__.pop(n) for n in names if n in value.__arguments__}
    if moved:
      setattr(value, field, fdl.Config(allow_list.resolve_ref(module, name)[1], **moved))
  return cfg


def load_file(path: str | Path, allow: Iterable[str] = ()) -> fdl.Buildable:
  path = Path(path)
  if not path.is_file():
    raise UserError(f'config file {path} does not exist')
  return from_json(path.read_text(), str(path), allow)


def flatten(cfg: fdl.Buildable) -> dict[str, str]:
  """`{path: repr}` of every leaf value and every callable in `cfg`."""
  flat = {}
  for value, path in daglish.iterate(cfg, memoized=False):
    name = daglish.path_str(path)
    if isinstance(value, fdl.Buildable):
      fn = fdl.get_callable(value)
      flat[name + '.<fn>'] = f'{fn.__module__}.{fn.__qualname__}'
    elif not isinstance(value, (list, tuple, dict)):
      flat[name] = repr(value)
  return flat


def _value_at(cfg: fdl.Buildable, flat: dict[str, str], key: str) -> str:
  """The repr at `key`, falling back to the default of a field left unset."""
  if key in flat:
    return flat[key]
  try:
    return repr(daglish.follow_path(cfg, daglish.parse_path(key)))
  except (AttributeError, KeyError, IndexError, TypeError, ValueError):
    return '<unset>'


def differences(old: fdl.Buildable, new: fdl.Buildable) -> list[str]:
  """Human-readable field differences (an unset field counts as its default), ignoring the
  fields a resumed run may change."""
  a, b = flatten(old), flatten(new)
  diffs = []
  for key in sorted(set(a) | set(b)):
    if key.startswith(RESUMABLE_FIELDS):
      continue
    before, after = _value_at(old, a, key), _value_at(new, b, key)
    if before != after:
      diffs.append(f'{key.lstrip(".")}: {before} -> {after}')
  return diffs
