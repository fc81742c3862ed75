import pytest

from paxlike import registry
from paxlike.errors import UserError


@pytest.fixture(scope='module', autouse=True)
def experiments():
  registry.import_all()


def test_lists_the_lm_experiments():
  assert {'lm.StdlibTiny', 'lm.ShakespeareTiny'} <= set(registry.keys())


def test_full_key_and_unique_suffix_find_the_same_class():
  assert registry.get('lm.StdlibTiny') is registry.get('StdlibTiny')
  assert registry.get('StdlibTiny').__name__ == 'StdlibTiny'


def test_ambiguous_suffix_lists_the_matches():
  @registry.register
  class StdlibTiny:  # Same class name, other module: `StdlibTiny` is now ambiguous.
    pass
  try:
    with pytest.raises(UserError, match=r'ambiguous: lm\.StdlibTiny, tests\.test_registry\.StdlibTiny'):
      registry.get('StdlibTiny')
    assert registry.get('lm.StdlibTiny') is not StdlibTiny
  finally:
    registry._EXPERIMENTS.pop('tests.test_registry.StdlibTiny')


def test_unknown_key_suggests_close_names():
  with pytest.raises(UserError, match='did you mean .*StdlibTiny'):
    registry.get('lm.StdlibTiyn')


@pytest.mark.parametrize('name', ['', '   '])
def test_empty_key_is_a_user_error(name):
  with pytest.raises(UserError, match='empty'):
    registry.get(name)
