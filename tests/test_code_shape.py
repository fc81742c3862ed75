"""The shape the package keeps: only the CLI and the public contracts in its root, no function
over 60 lines (a function that long does more than one thing)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import setuptools

import paxlike

ROOT = Path(paxlike.__file__).parent
ROOT_MODULES = {'__init__.py', '__main__.py', 'main.py', 'registry.py', 'experiment.py',
                'errors.py'}
MAX_FUNCTION_LINES = 60


def long_functions(path: Path) -> list[tuple[str, int]]:
  """(name, lines) of each function or method in `path` longer than MAX_FUNCTION_LINES."""
  tree = ast.parse(path.read_text(), str(path))
  return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
          and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_the_package_root_holds_only_the_cli_and_the_contracts():
  assert {p.name for p in ROOT.glob('*.py')} == ROOT_MODULES


def test_paxlike_is_the_one_top_level_package():
  # The experiments and building blocks are paxlike.experiments and paxlike.configs: a wheel
  # holds no top-level `configs` or `experiments` to clash with a user's own.
  repo = ROOT.parent
  include = tomllib.loads((repo / 'pyproject.toml').read_text())['tool']['setuptools'][
      'packages']['find']['include']
  packages = setuptools.find_packages(str(repo), include=include)
  assert {p.split('.')[0] for p in packages} == {'paxlike'}
  assert {'paxlike.configs', 'paxlike.experiments'} <= set(packages)
  assert not (repo / 'configs').exists() and not (repo / 'experiments').exists()


def test_no_function_is_over_60_lines():
  found = {f'{path.relative_to(ROOT)}:{name}': lines for path in sorted(ROOT.rglob('*.py'))
           for name, lines in long_functions(path)}
  assert found == {}


def test_the_length_check_sees_a_long_function(tmp_path):
  body = ''.join(f'  x{i} = {i}\n' for i in range(MAX_FUNCTION_LINES))
  (tmp_path / 'm.py').write_text(f'def short():\n  return 1\n\n\ndef long():\n{body}')
  assert long_functions(tmp_path / 'm.py') == [('long', MAX_FUNCTION_LINES + 1)]
