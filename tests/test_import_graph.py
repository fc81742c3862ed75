"""Imports in paxlike go one way: every import of every module (inside functions and under
`TYPE_CHECKING` too) is an edge; the graph of paxlike's modules has no cycle, and between
packages every edge goes down the layers of the house (LAYERS), so a back edge fails here.

The layers, bottom to top (a package imports only packages of lower layers; the README's
layout section draws the same table):

  errors                              one-line errors and their exit codes
  core, registry                      the contracts (Algorithm, LossFn, optimizer presets, mesh)
  layers, tokenizers, config          Flax layers; tokenizers; configs as data (safe JSON)
  data                                data sources (tokenize with tokenizers)
  federated                           primitives and algorithms, on core alone
  families                            what depends on the kind of model
  interop, decode                     Hugging Face checkpoints; KV-cache generation
  trainer                             the Task and everything that runs it
  configs, experiment                 reusable Fiddle building blocks; the Experiment base
  experiments                         the registered experiments (`lm.StdlibTiny`)
  cli                                 what the commands need besides main
  export                              federated program export and its executor
  deploy                              running an exported round elsewhere (Flower)
  main                                `python -m paxlike.main`, the job command's shim

`paxlike COMMAND` (paxlike/__main__.py, then paxlike.cli.dispatch) runs these programs by name,
as `python -m` does; none of them imports paxlike.main: their shared flags and runners are
paxlike.cli's.

Programs (a `__main__.py`, or a module with a `__main__` guard that no paxlike module
imports: `python -m paxlike.interop.hf`, `python -m paxlike.tokenizers`, ...) sit above every
layer whatever their folder: they run a command and may import anything.
"""

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


LAYERS = (
    ('errors',),
    ('core', 'registry'),
    ('layers', 'tokenizers', 'config'),
    ('data',),
    ('federated',),
    ('families',),
    ('interop', 'decode'),
    ('trainer',),
    ('configs', 'experiment'),
    ('experiments',),
    ('cli',),
    ('export',),
    ('deploy',),
    ('main',),
)


def package_of(module: str) -> str | None:
  """'paxlike.trainer.loop' -> 'trainer', 'paxlike.main' -> 'main', the root package -> None."""
  parts = module.split('.')
  return parts[1] if len(parts) > 1 else None


def programs(root: Path, graph: dict[str, set[str]]) -> set[str]:
  """The modules run as commands that no module of the package imports: `__main__.py` files
  and modules with an `if __name__ == '__main__':` guard."""
  imported_somewhere = set().union(*graph.values())
  found = set()
  for name, path in module_names(root).items():
    tree = ast.parse(path.read_text(), str(path))
    guarded = any(isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                  and isinstance(node.test.left, ast.Name) and node.test.left.id == '__name__'
                  for node in tree.body)
    if (path.name == '__main__.py' or guarded) and name not in imported_somewhere:
      found.add(name)
  return found


def back_edges(graph: dict[str, set[str]], layers: tuple[tuple[str, ...], ...],
               exempt: set[str] = frozenset()) -> list[str]:
  """'a.b -> c.d' for every import from a package to one of the same or a higher layer (a
  package missing from `layers` is an error of its own), skipping modules in `exempt`."""
  level = {package: i for i, row in enumerate(layers) for package in row}
  found = []
  for source, targets in sorted(graph.items()):
    if source in exempt or package_of(source) is None:
      continue
    for target in sorted(targets):
      a, b = package_of(source), package_of(target)
      if b is None or a == b:
        continue
      if a not in level or b not in level:
        found.append(f'{source} -> {target} (package {a if a not in level else b} has no layer)')
      elif level[b] >= level[a]:
        found.append(f'{source} -> {target}')
  return found


def test_paxlike_has_no_import_cycle():
  graph = import_graph(ROOT)
  assert len(graph) > 50 and 'paxlike.families.lm' in graph['paxlike.families']
  cycle = find_cycle(graph)
  assert cycle is None, 'import cycle: ' + ' -> '.join(cycle)


def test_packages_import_only_the_layers_below_them():
  graph = import_graph(ROOT)
  assert back_edges(graph, LAYERS, programs(ROOT, graph)) == []


def test_the_programs_are_the_commands():
  graph = import_graph(ROOT)
  found = programs(ROOT, graph)
  assert {'paxlike.interop.hf', 'paxlike.interop.hf_llama', 'paxlike.tokenizers.__main__',
          'paxlike.export.__main__', 'paxlike.deploy.flower.local', 'paxlike.main',
          'paxlike.__main__'} <= found
  # Imported by export.artifacts: it keeps to its layer.
  assert 'paxlike.export.run' not in found


def test_the_experiments_and_building_blocks_have_their_layers():
  # paxlike.configs and paxlike.experiments (top-level packages before they moved under
  # paxlike) sit above the trainer; registry and cli find them by name, not by import.
  graph = import_graph(ROOT)
  assert {'paxlike.configs.fiddlers', 'paxlike.experiments.lm'} <= set(graph)
  assert 'paxlike.configs.models' in graph['paxlike.experiments.lm']
  level = {package: i for i, row in enumerate(LAYERS) for package in row}
  assert level['trainer'] < level['configs'] < level['experiments'] < level['cli']
  importers = {package_of(name) for name, targets in graph.items()
               if any(t.startswith('paxlike.experiments') for t in targets)}
  assert importers == {'experiments'}


def test_only_the_cli_and_the_main_shims_import_paxlike_main():
  # The command line is the roof: the programs' shared flags and runners live in paxlike.cli,
  # so no package (export, deploy, ...) reaches up into paxlike.main for them.
  graph = import_graph(ROOT)
  importers = {name for name, targets in graph.items() if 'paxlike.main' in targets}
  assert {name for name in importers
          if not name.startswith('paxlike.cli.') and not name.endswith('.__main__')} == set()
  assert importers == set()  # Today not even those: main is the shim of the job command.


def test_each_subcommand_runs_a_program_of_the_package():
  from paxlike.cli.commands import COMMANDS
  names, graph = module_names(ROOT), import_graph(ROOT)
  runnable = programs(ROOT, graph) | {'paxlike.export.run'}  # Its guard, beside its importers.
  for command in (c for c in COMMANDS if c.module is not None):
    package_main = f'{command.module}.__main__'  # What `python -m PACKAGE` runs.
    assert (package_main if package_main in names else command.module) in runnable, command


def test_a_back_edge_and_an_unplaced_package_are_found(tmp_path):
  pkg = tmp_path / 'pkg'
  for sub in ('low', 'high', 'new'):
    (pkg / sub).mkdir(parents=True)
    (pkg / sub / '__init__.py').write_text('')
  (pkg / '__init__.py').write_text('')
  (pkg / 'high' / 'a.py').write_text('from pkg.low import b\n')
  (pkg / 'low' / 'b.py').write_text('def f():\n  from pkg.high import a\n')
  (pkg / 'low' / '__main__.py').write_text('from pkg.high import a\n')
  (pkg / 'new' / 'c.py').write_text('import pkg.low.b\n')
  graph = import_graph(pkg)
  layers = (('low',), ('high',))
  assert back_edges(graph, layers, programs(pkg, graph)) == [
      'pkg.low.b -> pkg.high.a',
      'pkg.new.c -> pkg.low.b (package new has no layer)']
  (pkg / 'low' / 'b.py').write_text('')
  (pkg / 'new' / 'c.py').write_text('')
  assert back_edges(import_graph(pkg), layers, programs(pkg, import_graph(pkg))) == []


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
