"""What a serialized config may name: the modules it may import (ALLOWED_MODULES), the
functions and classes it may call (BUILDING_BLOCKS, CLASSES_ONLY, BUILTINS, dtypes), and the
modules and packages that moved since a config was saved (MOVED_MODULES, MOVED_PACKAGES), read
under their new names."""

from __future__ import annotations

import importlib
import types
from typing import Any, Iterable

import jax.numpy as jnp
import numpy as np

ALLOWED_MODULES = ('builtins', 'fiddle', 'paxlike', 'flax', 'optax', 'jax', 'numpy', 'ml_dtypes')
DTYPES = ('float32', 'bfloat16', 'float16')  # The float dtypes a config may name by name.


def is_allowed(module: str, allow: Iterable[str] = ()) -> bool:
  """Whether `module` is on the import allow-list (plus the user's `allow` additions)."""
  return any(module == a or module.startswith(a + '.') for a in ALLOWED_MODULES + tuple(allow))


def moved_module(module: str, name: str) -> str:
  """The module that holds `module.name` now: MOVED_MODULES' new name for one of its modules;
  for a module of MOVED_PACKAGES, the same module under its new package when that has `name`
  (`configs.models`, `lm_tiny` -> `paxlike.configs.models`; a user's own `configs` package,
  whose names paxlike's lacks, keeps its own); else `module` itself."""
  if module in MOVED_MODULES:
    return MOVED_MODULES[module]
  for old, new in MOVED_PACKAGES.items():
    if module == old or module.startswith(old + '.'):
      moved = new + module[len(old):]
      found, obj = resolve_ref(moved, name)
      return moved if found and obj is not None else module
  return module


def with_moved_modules(node: Any) -> Any:
  """`node` (parsed JSON) with every pyref to a moved module (`moved_module`) renamed."""
  if isinstance(node, dict):
    node = {key: with_moved_modules(value) for key, value in node.items()}
    if node.get('type') == 'pyref' and isinstance(node.get('module'), str):
      node['module'] = moved_module(node['module'], str(node.get('name', '')))
    return node
  if isinstance(node, list):
    return [with_moved_modules(value) for value in node]
  return node


def pyrefs(node: Any) -> Iterable[tuple[str, str]]:
  """Every (module, name) a serialized config imports."""
  if isinstance(node, dict):
    if node.get('type') == 'pyref':
      yield node.get('module', ''), node.get('name', '')
    for value in node.values():
      yield from pyrefs(value)
  elif isinstance(node, list):
    for value in node:
      yield from pyrefs(value)


# What configs are made of: the packages whose classes and functions a config may call (the
# object itself must be defined under one of them, so a re-exported `os.system` is no way in),
# the packages that may give classes only (data sources, layers, Fiddle's buildables), and by
# name the builtin containers and the dtypes. Nothing else: not `numpy.load` or `builtins.open`,
# though their modules are importable for dtypes and containers.
BUILDING_BLOCKS = ('paxlike.layers', 'paxlike.federated', 'paxlike.trainer.centralized',
                   'paxlike.core.optim', 'paxlike.trainer.task', 'paxlike.core.partitioning',
                   'paxlike.core.algorithm', 'paxlike.trainer.rewards', 'paxlike.experiments',
                   'paxlike.configs', 'optax', 'jax.nn', 'jax._src.nn')
# Building blocks that moved, under the names configs saved before each move use: a job dir
# saved then still resumes (its config.json is read with the new names). First into the trainer
# package (paxlike.optim -> paxlike.trainer.optim), then the contracts into the leaf package
# paxlike.core (paxlike.trainer.optim -> paxlike.core.optim); the Task and TrainConfig from
# the experiment module into the trainer (paxlike.experiment -> paxlike.trainer.task).
MOVED_MODULES = {
    'paxlike.centralized': 'paxlike.trainer.centralized',
    'paxlike.experiment': 'paxlike.trainer.task',
    **{f'{package}.{name}': f'paxlike.core.{name}'
       for package in ('paxlike', 'paxlike.trainer')
       for name in ('optim', 'partitioning', 'algorithm')},
}
# Packages that moved, with every module in them: the experiments and the building blocks were
# top-level packages beside paxlike (where a user's own `configs` clashed) before they moved
# under it, and configs saved then name them so.
MOVED_PACKAGES = {'configs': 'paxlike.configs', 'experiments': 'paxlike.experiments'}
# Arguments that moved into a record since a config was saved: (module, class) -> (the argument
# that holds the record now, the record's (module, class), the names that moved into it). A job
# dir saved before TextData grouped its row fields into `fields` still resumes.
MOVED_ARGUMENTS = {
    ('paxlike.data.text_data', 'TextData'): (
        'fields', ('paxlike.data.text_files', 'Fields'),
        ('text_field', 'txt_document', 'prompt_field', 'completion_field', 'client_field',
         'messages_field')),
}


def moved_argument(fn_or_cls: Any, name: str) -> str | None:
  """The argument of `fn_or_cls` whose record holds its former argument `name` now (e.g.
  'fields' for TextData's 'client_field': MOVED_ARGUMENTS), or None where `name` never moved."""
  if not isinstance(fn_or_cls, type):
    return None
  field, _, names = MOVED_ARGUMENTS.get((fn_or_cls.__module__, fn_or_cls.__qualname__),
                                        (None, None, ()))
  return field if name in names else None


# A new objective's loss config lives in its module under paxlike.trainer.objectives.
CLASSES_ONLY = ('paxlike.data', 'paxlike.trainer.preference_loss', 'paxlike.trainer.grpo_loss',
                'paxlike.trainer.objectives',
                'flax.linen',
                'fiddle._src.config', 'fiddle._src.partial', 'fiddle._src.tagging')
BUILTINS = ('dict', 'tuple', 'list', 'set', 'frozenset', 'slice', 'int', 'float', 'bool',
            'str', 'complex', 'bytes', 'range')


def _under(module: str | None, prefixes: Iterable[str]) -> bool:
  return bool(module) and any(module == p or module.startswith(p + '.') for p in prefixes)


def _is_dtype_object(obj: Any) -> bool:
  if any(obj is getattr(jnp, name) for name in DTYPES + ('int32', 'int8', 'uint8')):
    return True
  return isinstance(obj, type) and issubclass(obj, np.generic)


def refusal(obj: Any, allow: Iterable[str] = ()) -> str | None:
  """Why a config may not name `obj` (None when it may): see BUILDING_BLOCKS."""
  if _is_dtype_object(obj):
    return None
  if isinstance(obj, types.ModuleType):
    return f'it reaches into module {obj.__name__}'
  if not callable(obj):
    return 'it is not a class or function'
  module = getattr(obj, '__module__', None)
  if module == 'builtins':
    return None if getattr(obj, '__name__', None) in BUILTINS else 'a builtin with effects'
  if _under(module, BUILDING_BLOCKS + tuple(allow)):
    return None
  if _under(module, CLASSES_ONLY) and isinstance(obj, type):
    return None
  return f'it is defined in {module}, whose functions a config may not call'


def resolve_ref(module: str, name: str) -> tuple[bool, Any]:
  """(found, object) of `module.name`, walking `name`'s dotted parts (call for allow-listed
  modules only). A module met on the way (`os` in `numpy.lib._npyio_impl.os.system`) is the
  result, for `refusal` to refuse."""
  try:
    target = importlib.import_module(module)
  except ModuleNotFoundError as error:  # Only the module itself missing is a stale name.
    return not (error.name and (module + '.').startswith(error.name + '.')), None
  for part in name.split('.'):
    if not hasattr(target, part):
      return False, None
    target = getattr(target, part)
    if isinstance(target, types.ModuleType):
      return True, target
  return True, target
