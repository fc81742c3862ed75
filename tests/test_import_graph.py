"""No import circle in paxlike: every import of every module (inside functions and under
`TYPE_CHECKING` too) is an edge, and the graph of paxlike's modules has no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import paxlike

ROOT = Path(paxlike.__file__).parent


def module_names(root: Path) -> dict[str, Path]:
  """'pkg.sub.mod' -> file, for every .py file of the package at `root`."""
  names = {}
  for path in sorted(root.rglob('*.py')):
    parts = path.relative_to(root.parent).with_suffix('').parts
    names['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = path
  return names


def imported(name: str, path: Path, modules: set[str]) -> set[str]:
  """The modules of `modules` that module `name` (at `path`) imports, anywhere in the file:
  `from pkg import sub` names the submodule where `sub` is one, else `pkg`."""
  package = name if path.name == '__init__.py' else name.rpartition('.')[0]
  found = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        anchor = package.split('.')[:len(package.split('.')) - node.level + 1]
        base = '.'.join([*anchor, base] if base else anchor)
      targets = [f'{base}.{a.name}' if f'{base}.{a.name}' in modules else base
                 for a in node.names]
    else:
      continue
    for target in targets:
      while target and target not in modules:  # `import a.b.c` of a non-module tail.
        target = target.rpartition('.')[0]
      if target and target != name:
        found.add(target)
  return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One cycle of `graph` as [a, b, ..., a], or None (iterative depth-first search)."""
  state: dict[str, int] = {}  # 1: on the current path, 2: done.
  for start in sorted(graph):
    if start in state:
      continue
    path, stack = [start], [iter(sorted(graph[start]))]
    state[start] = 1
    while stack:
      nxt = next(stack[-1], None)
      if nxt is None:
        state[path.pop()] = 2
        stack.pop()
      elif state.get(nxt) == 1:
        return path[path.index(nxt):] + [nxt]
      elif nxt not in state:
        state[nxt] = 1
        path.append(nxt)
        stack.append(iter(sorted(graph.get(nxt, ()))))
  return None


def import_graph(root: Path) -> dict[str, set[str]]:
  modules = module_names(root)
  return {name: imported(name, path, set(modules)) for name, path in modules.items()}


def test_paxlike_has_no_import_cycle():
  graph = import_graph(ROOT)
  assert len(graph) > 50 and 'paxlike.families.lm' in graph['paxlike.families']
  cycle = find_cycle(graph)
  assert cycle is None, 'import cycle: ' + ' -> '.join(cycle)


def test_a_type_only_circle_is_found(tmp_path):
  pkg = tmp_path / 'pkg'
  (pkg / 'sub').mkdir(parents=True)
  (pkg / '__init__.py').write_text('')
  (pkg / 'sub' / '__init__.py').write_text('from pkg.sub import c\n')
  (pkg / 'a.py').write_text('from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n'
                            '  from pkg.sub.c import C\n')
  (pkg / 'b.py').write_text('import json\nfrom . import a\n')
  (pkg / 'sub' / 'c.py').write_text('def f():\n  from ..b import g\n')
  graph = import_graph(pkg)
  assert graph == {'pkg': set(), 'pkg.sub': {'pkg.sub.c'}, 'pkg.a': {'pkg.sub.c'},
                   'pkg.b': {'pkg.a'}, 'pkg.sub.c': {'pkg.b'}}
  assert find_cycle(graph) == ['pkg.a', 'pkg.sub.c', 'pkg.b', 'pkg.a']
  (pkg / 'a.py').write_text('')
  assert find_cycle(import_graph(pkg)) is None
