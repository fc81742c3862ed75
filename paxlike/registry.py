"""The experiment registry.

Experiments come from three places:
- paxlike's own `paxlike.experiments` package: keys are `<module under it>.<ClassName>`
  (e.g. `lm.StdlibTiny`; its full name, or the `experiments.` one from before it moved under
  paxlike, finds it too);
- any importable module: `get('my_project.my_module.MyExperiment')` imports
  `my_project.my_module` (the user named it, so it is trusted) and its key is that full name;
- installed plugins: every module named in the entry-point group `paxlike.experiments`.
Any unique dotted suffix of a key finds it.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import pkgutil
import sys

from paxlike.errors import UserError

_EXPERIMENTS: dict[str, type] = {}
_PLUGINS: dict[str, str] = {}  # Module name -> the distribution whose entry point imported it.
_PACKAGE = 'paxlike.experiments'
# What a key of paxlike's own may be prefixed with: its package, and the top-level name that
# package had before it moved under paxlike.
_OWN_PREFIXES = (_PACKAGE + '.', 'experiments.')
ENTRY_POINT_GROUP = 'paxlike.experiments'


def register(cls: type) -> type:
  """Class decorator: adds `cls` to the registry under its module-relative key."""
  key = key_of(cls)
  if _EXPERIMENTS.get(key, cls) is not cls:
    raise ValueError(f'experiment {key} registered twice')
  _EXPERIMENTS[key] = cls
  return cls


def key_of(cls: type) -> str:
  """`lm.StdlibTiny` for the repo's experiments, `module.Class` for everyone else's."""
  return f'{cls.__module__.removeprefix(_PACKAGE + ".")}.{cls.__name__}'


def import_all() -> None:
  """Imports every module of the `paxlike.experiments` package and every plugin module."""
  package = importlib.import_module(_PACKAGE)
  for info in pkgutil.iter_modules(package.__path__, _PACKAGE + '.'):
    importlib.import_module(info.name)
  for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
    dist = f'{entry.dist.name} {entry.dist.version}' if entry.dist else entry.name
    try:
      entry.load()
    except Exception as error:  # A broken plugin must not take the other experiments down.
      print(f'paxlike: warning: skipping plugin {dist} ({entry.value}): '
            f'{type(error).__name__}: {error}', file=sys.stderr)
      continue
    _PLUGINS[entry.module] = dist


def keys() -> list[str]:
  """All registered keys, sorted."""
  return sorted(_EXPERIMENTS)


def trusted_modules() -> list[str]:
  """Top-level packages of the registered experiments: already imported, so a saved config of
  theirs may import from them again."""
  return sorted({cls.__module__.split('.')[0] for cls in _EXPERIMENTS.values()})


def origin(key: str) -> str:
  """Where experiment `key` comes from: `paxlike`, `plugin <dist> <version>` or `module <name>`."""
  module = _EXPERIMENTS[key].__module__
  if module == _PACKAGE or module.startswith(_PACKAGE + '.'):
    return 'paxlike'
  plugin = next((d for m, d in _PLUGINS.items() if module == m or module.startswith(m + '.')), None)
  return f'plugin {plugin}' if plugin else f'module {module}'


def summary(key: str, width: int = 100) -> str:
  """The first paragraph of the experiment's docstring on one line, cut to `width` characters."""
  paragraph = ' '.join((_EXPERIMENTS[key].__doc__ or '').strip().split('\n\n')[0].split())
  return paragraph if len(paragraph) <= width else paragraph[:width - 3].rstrip() + '...'


def listing() -> str:
  """One line per experiment: key, origin and one-line summary, in aligned columns."""
  rows = [(k, origin(k), summary(k)) for k in keys()]
  width = [max((len(r[i]) for r in rows), default=0) for i in range(2)]
  return '\n'.join(f'{k:<{width[0]}}  {o:<{width[1]}}  {s}'.rstrip() for k, o, s in rows)


def _import_named_module(name: str) -> None:
  """Imports the module part of a dotted `module.Class` name, if there is such a module."""
  module = name.rpartition('.')[0]
  if not module:
    return
  try:
    found = importlib.util.find_spec(module) is not None
  except (ImportError, ValueError):  # A parent package is missing or not a package.
    found = False
  if not found:
    return
  try:
    importlib.import_module(module)
  except Exception as error:
    raise UserError(f'--exp={name}: importing {module} failed: '
                    f'{type(error).__name__}: {error}') from None


def get(name: str) -> type:
  """The experiment class for a key, a unique dotted suffix of one, or `module.Class`."""
  if not name or not name.strip():
    raise UserError('--exp is empty; use --list to see the experiments')
  candidates = [name, *(name.removeprefix(p) for p in _OWN_PREFIXES if name.startswith(p))]
  if not any(key in _EXPERIMENTS for key in candidates):
    _import_named_module(name)
  for key in candidates:
    if key in _EXPERIMENTS:
      return _EXPERIMENTS[key]
  matches = [k for k in _EXPERIMENTS if k.endswith('.' + name)]
  if len(matches) == 1:
    return _EXPERIMENTS[matches[0]]
  if matches:
    raise UserError(f'experiment {name!r} is ambiguous: {", ".join(sorted(matches))}')
  module, _, cls_name = name.rpartition('.')
  if module in sys.modules and isinstance(getattr(sys.modules[module], cls_name, None), type):
    raise UserError(f'{name} is not registered; decorate the class with '
                    '@paxlike.registry.register')
  names = list(_EXPERIMENTS) + [k.rsplit('.', 1)[-1] for k in _EXPERIMENTS]
  close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
  hint = f'; did you mean {", ".join(close)}?' if close else '; use --list to see the experiments'
  raise UserError(f'unknown experiment {name!r}{hint}')
