"""paxlike.config.names.resolve, the one resolver of 'module.function' names (reward functions,
fiddlers, exported trees' node classes): what it returns, and each refusal as one UserError
line that names what was asked for."""

from __future__ import annotations

import sys
import types

import pytest

from paxlike.config import names
from paxlike.errors import UserError

MODULES = ('paxlike', 'my_module')


@pytest.fixture
def my_module(monkeypatch):
  module = types.ModuleType('my_module')
  module.score = lambda prompts, completions: [0.0 for _ in completions]
  module.LIMIT = 3
  module.Box = type('Box', (), {'inner': staticmethod(lambda: 'inner')})
  monkeypatch.setitem(sys.modules, 'my_module', module)
  return module


def refusal(name: str, **kwargs) -> str:
  """The one line `resolve` raises for `name`."""
  with pytest.raises(UserError) as error:
    names.resolve(name, 'reward function', kwargs.pop('modules', MODULES), **kwargs)
  message = str(error.value)
  assert '\n' not in message and message.startswith(f'reward function {name}')
  return message


def test_dotted_colon_and_bare_names(my_module):
  assert names.resolve('my_module.score', 'x', MODULES) is my_module.score
  assert names.resolve('my_module:score', 'x', MODULES) is my_module.score
  assert names.resolve('my_module:Box.inner', 'x', MODULES)() == 'inner'
  assert names.resolve('score', 'x', MODULES, default_module='my_module') is my_module.score
  assert names.resolve('my_module.LIMIT', 'x', MODULES, callable_only=False) == 3


def test_a_bad_module_is_one_line():
  assert refusal('my_missing_module.fn', modules=('my_missing_module',)) == (
      "reward function my_missing_module.fn: cannot import module my_missing_module "
      "(No module named 'my_missing_module')")


def test_a_module_that_fails_to_import_is_one_line(tmp_path, monkeypatch):
  (tmp_path / 'my_broken.py').write_text('raise ValueError("not today")\n')
  monkeypatch.syspath_prepend(str(tmp_path))
  assert refusal('my_broken.fn', modules=('my_broken',)) == (
      'reward function my_broken.fn: importing my_broken failed: ValueError: not today')


def test_a_missing_attribute_is_one_line(my_module):
  assert refusal('my_module.nothing') == (
      "reward function my_module.nothing: my_module has no 'nothing'")
  assert refusal('my_module:Box.gone') == "reward function my_module:Box.gone: Box has no 'gone'"


def test_a_non_callable_is_one_line(my_module):
  assert refusal('my_module.LIMIT') == (
      'reward function my_module.LIMIT is not callable (its type is int)')


def test_a_module_off_the_list_a_module_object_and_a_check_are_refused(my_module):
  assert refusal('os.system') == ('reward function os.system is not allowed: pass '
                                  '--allow_import=os if you trust it')
  assert refusal('os.system', allow_flag=False) == (
      'reward function os.system is not allowed: module os is not one it may come from')
  assert refusal('paxlike.core.files.os') == (
      'reward function paxlike.core.files.os is not allowed: it is module os')
  assert refusal('my_module.Box', check=lambda obj: 'a class' if isinstance(obj, type) else None
                 ) == 'reward function my_module.Box is not allowed: a class'


def test_malformed_names_are_one_line():
  for name in ('score', 'my_module.', 'my_module:a..b', ''):
    assert "name it as 'module.function'" in refusal(name)


def test_each_site_resolves_through_it(monkeypatch):
  """Fiddlers, reward functions and tree node classes: a missing name is this resolver's line."""
  from paxlike.cli import run_config  # pylint: disable=import-outside-toplevel
  from paxlike.export import trees  # pylint: disable=import-outside-toplevel
  from paxlike.trainer import rewards  # pylint: disable=import-outside-toplevel
  seen = []
  real = names.resolve
  monkeypatch.setattr(names, 'resolve', lambda *a, **k: seen.append(a[1]) or real(*a, **k))
  for resolve, name in [(run_config.fiddler_named, 'huge'),
                        (rewards.resolve, 'paxlike.trainer.rewards.huge'),
                        (lambda n: trees.from_json({'type': 'namedtuple', 'class': n,
                                                    'fields': {}}), 'paxlike.core.Huge')]:
    with pytest.raises(UserError, match="has no 'huge'|has no 'Huge'"):
      resolve(name)
  assert seen == ['fiddler', 'reward function', 'tree node class']
