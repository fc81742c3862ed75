"""The object a flag or a config names by a string: 'module.function' (or 'module:attr.path'),
as a reward function, a fiddler or an exported tree's node class is named. Every refusal is one
UserError line that starts with what was asked for."""

from __future__ import annotations

import importlib
import types
from typing import Any, Callable, Iterable

from paxlike.errors import UserError

Check = Callable[[Any], 'str | None']


def split(name: str, default_module: str | None = None) -> tuple[str, str]:
  """(module, attribute path) of 'module:attr.path' or 'module.attr'; a bare 'attr' is in
  `default_module` (None: a bare name is refused)."""
  if ':' in name:
    module, _, attr = name.partition(':')
  else:
    module, _, attr = name.rpartition('.')
  return module or default_module or '', attr


def _imported(module: str, asked: str) -> types.ModuleType:
  try:
    return importlib.import_module(module)
  except ImportError as error:
    raise UserError(f'{asked}: cannot import module {module} ({error})') from None
  except Exception as error:  # pylint: disable=broad-except (the user's module, one line)
    raise UserError(f'{asked}: importing {module} failed: {type(error).__name__}: {error}'
                    ) from None


def resolve(name: str, what: str, modules: Iterable[str], check: Check | None = None,
            default_module: str | None = None, callable_only: bool = True,
            allow_flag: bool = True, moved: Callable[[str, str], str] | None = None) -> Any:
  """The object `name` names, for a `what` ('reward function', 'fiddler', ...) that may come
  only from `modules` (module name prefixes). UserError, one line naming `what` and `name`, when
  the name is malformed, its module is not allowed (`allow_flag`: the refusal names
  --allow_import) or cannot be imported, the attribute is missing, a module, not callable
  (`callable_only`), or `check(obj)` gives a reason. `moved(module, attr)`: the module's name
  now, for names saved before it moved (allow_list.moved_module)."""
  asked = f'{what} {name}'
  module, attr = split(str(name), default_module)
  if not module or not attr or '' in attr.split('.'):
    raise UserError(f"{asked}: name it as 'module.function'")
  if moved is not None:
    module = moved(module, attr.split('.')[0])
  if not any(module == m or module.startswith(m + '.') for m in modules):
    raise UserError(f'{asked} is not allowed: ' + (
        f'pass --allow_import={module.split(".")[0]} if you trust it' if allow_flag
        else f'module {module} is not one it may come from'))
  obj: Any = _imported(module, asked)
  for part in attr.split('.'):
    if not hasattr(obj, part):
      raise UserError(f'{asked}: {getattr(obj, "__name__", module)} has no {part!r}')
    obj = getattr(obj, part)
    if isinstance(obj, types.ModuleType):
      raise UserError(f'{asked} is not allowed: it is module {obj.__name__}')
  if callable_only and not callable(obj):
    raise UserError(f'{asked} is not callable (its type is {type(obj).__name__})')
  why = check(obj) if check is not None else None
  if why is not None:
    raise UserError(f'{asked} is not allowed: {why}')
  return obj
