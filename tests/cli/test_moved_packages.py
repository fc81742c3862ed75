"""The experiments and building blocks moved under paxlike (`configs` -> `paxlike.configs`,
`experiments` -> `paxlike.experiments`): what named them by their old top-level names still loads.

No registered experiment's saved config.json names either package (their configs are made of
paxlike's layers, data and optimizers; test_no_saved_config_names_the_moved_packages checks it
today), so the place an old name could be met is a config that names one of their functions or
classes itself, and a fiddler named by module. Both go through allow_list.MOVED_PACKAGES.
"""

from __future__ import annotations

import fiddle as fdl
import pytest

from paxlike import registry
from paxlike.cli import run_config
from paxlike.config import allow_list, config_io
from paxlike.configs import fiddlers, models
from paxlike.errors import UserError
from paxlike.experiments import lm


def test_no_saved_config_names_the_moved_packages():
  registry.import_all()
  for key in registry.keys():
    text = config_io.to_json(registry.get(key)().config())
    assert '"paxlike.configs' not in text and '"paxlike.experiments' not in text, key


def test_a_config_naming_the_old_top_level_packages_loads():
  cfg = fdl.Config(dict, model=fdl.Partial(models.lm_tiny), experiment=fdl.Config(lm.StdlibTiny))
  text = config_io.to_json(cfg)
  old = text
  for new_name, old_name in (('paxlike.configs.models', 'configs.models'),
                             ('paxlike.experiments.lm', 'experiments.lm')):
    assert f'"{new_name}"' in old, new_name
    old = old.replace(f'"{new_name}"', f'"{old_name}"')
  assert '"paxlike.configs' not in old and '"paxlike.experiments' not in old
  loaded = config_io.from_json(old, 'old.json')
  assert loaded == cfg
  assert fdl.get_callable(loaded.model) is models.lm_tiny


def test_only_names_paxlike_has_move():
  assert allow_list.moved_module('configs.models', 'lm_tiny') == 'paxlike.configs.models'
  assert allow_list.moved_module('experiments', 'lm') == 'paxlike.experiments'
  # A user's own `configs` package: names paxlike's lacks stay theirs.
  assert allow_list.moved_module('configs.models', 'my_model') == 'configs.models'
  assert allow_list.moved_module('configs.mine', 'thing') == 'configs.mine'
  assert allow_list.moved_module('configsx.models', 'lm_tiny') == 'configsx.models'


def test_a_users_configs_module_is_not_imported_as_paxlikes():
  text = config_io.to_json(fdl.Partial(models.lm_tiny))
  assert text.count('"paxlike.configs.models"') == 1
  text = text.replace('"paxlike.configs.models"', '"configs.mine"')
  with pytest.raises(UserError, match="imports 'configs.mine', which is not allowed"):
    config_io.from_json(text, 'mine.json')


@pytest.mark.parametrize('name', ['tiny', 'paxlike.configs.fiddlers.tiny',
                                  'configs.fiddlers.tiny'])
def test_fiddlers_by_their_new_and_old_names(name):
  assert run_config.fiddler_named(name) is fiddlers.tiny
