"""The experiment registry. Keys are `<module under experiments>.<ClassName>` (e.g.
`lm.StdlibTiny`); any unique dotted suffix of a key finds it."""

from __future__ import annotations

import difflib
import importlib
import pkgutil

from paxlike.errors import UserError

_EXPERIMENTS: dict[str, type] = {}
_PACKAGE = 'experiments'


def register(cls: type) -> type:
  """Class decorator: adds `cls` to the registry under its module-relative key."""
  module = cls.__module__.removeprefix(_PACKAGE + '.')
  key = f'{module}.{cls.__name__}'
  if _EXPERIMENTS.get(key, cls) is not cls:
    raise ValueError(f'experiment {key} registered twice')
  _EXPERIMENTS[key] = cls
  return cls


def import_all() -> None:
  """Imports every module of the `experiments` package, registering what they define."""
  package = importlib.import_module(_PACKAGE)
  for info in pkgutil.iter_modules(package.__path__, _PACKAGE + '.'):
    importlib.import_module(info.name)


def keys() -> list[str]:
  """All registered keys, sorted."""
  return sorted(_EXPERIMENTS)


def get(name: str) -> type:
  """The experiment class for a key or unique dotted suffix of one."""
  if not name or not name.strip():
    raise UserError('--exp is empty; use --list to see the experiments')
  if name in _EXPERIMENTS:
    return _EXPERIMENTS[name]
  matches = [k for k in _EXPERIMENTS if k.endswith('.' + name)]
  if len(matches) == 1:
    return _EXPERIMENTS[matches[0]]
  if matches:
    raise UserError(f'experiment {name!r} is ambiguous: {", ".join(sorted(matches))}')
  names = list(_EXPERIMENTS) + [k.rsplit('.', 1)[-1] for k in _EXPERIMENTS]
  close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
  hint = f'; did you mean {", ".join(close)}?' if close else '; use --list to see the experiments'
  raise UserError(f'unknown experiment {name!r}{hint}')
