import importlib
import os
import subprocess
import sys

import pytest

from paxlike import registry
from paxlike.errors import UserError
from tests import helpers


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


USER_MODULE = '''
"""A user's experiments, outside the paxlike checkout."""
import fiddle as fdl
from paxlike.configs import models, tasks
from paxlike.data import LmData
from paxlike.experiment import Experiment
from paxlike.registry import register


class MyLmData(LmData):
  """The user's own data class (here: the stdlib LM data, unchanged)."""


@register
class Mine(Experiment):
  """My tiny LM: seven steps.

  More text that --list leaves out.
  """

  def task(self):
    model = models.lm_tiny()
    model.num_layers = 1
    return tasks.centralized_task(model, num_steps=7, peak_lr=1e-3)

  def datasets(self):
    return fdl.Config(MyLmData, dataset='stdlib', seq_len=32, batch_size=4, num_eval_batches=1)


class Unregistered(Mine):
  pass
'''


def user_env(*paths) -> dict[str, str]:
  return helpers.cli_env(PYTHONPATH=os.pathsep.join(map(str, [*paths, helpers.REPO])))


@pytest.mark.slow
def test_cli_trains_and_resumes_an_experiment_from_a_module_on_pythonpath(tmp_path):
  """From outside the checkout; the saved config names the user's own data class, which the
  resume must be allowed to import."""
  (tmp_path / 'myexps.py').write_text(USER_MODULE)
  job = tmp_path / 'job'
  for steps in (2, 3):
    proc = subprocess.run([sys.executable, '-m', 'paxlike.main', '--exp=myexps.Mine',
                           f'--job_log_dir={job}', f'--fdl_set=train.num_steps={steps}'],
                          cwd=tmp_path, env=user_env(tmp_path), capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
  assert '"module": "myexps"' in (job / 'config.json').read_text()
  assert [r['step'] for r in helpers.metric_rows(job)] == [2, 3]


@pytest.fixture
def user_module(tmp_path, monkeypatch):
  """`myexps` importable in-process; its registrations are undone afterwards."""
  (tmp_path / 'myexps.py').write_text(USER_MODULE)
  monkeypatch.syspath_prepend(str(tmp_path))
  before = dict(registry._EXPERIMENTS)
  yield tmp_path
  registry._EXPERIMENTS.clear()
  registry._EXPERIMENTS.update(before)
  registry._PLUGINS.clear()
  for name in [m for m in sys.modules if m.split('.')[0] in ('myexps', 'myplugin')]:
    del sys.modules[name]


def test_dotted_name_imports_its_module_and_keeps_short_keys(user_module):
  mine = registry.get('myexps.Mine')
  assert mine.__module__ == 'myexps' and registry.origin('myexps.Mine') == 'module myexps'
  assert registry.get('Mine') is mine  # Once imported, a unique suffix finds it too.
  tiny = registry.get('lm.StdlibTiny')
  assert tiny.__module__ == 'paxlike.experiments.lm' and registry.key_of(tiny) == 'lm.StdlibTiny'
  # Its full name, and the one from before the package moved under paxlike, find it too.
  assert registry.get('paxlike.experiments.lm.StdlibTiny') is tiny
  assert registry.get('experiments.lm.StdlibTiny') is tiny


def test_unregistered_class_and_failing_import_are_user_errors(user_module):
  with pytest.raises(UserError, match='myexps.Unregistered is not registered; decorate'):
    registry.get('myexps.Unregistered')
  (user_module / 'broken.py').write_text('raise RuntimeError("boom")\n')
  with pytest.raises(UserError, match='importing broken failed: RuntimeError: boom'):
    registry.get('broken.Anything')
  with pytest.raises(UserError, match="unknown experiment 'nosuchmodule.Mine'"):
    registry.get('nosuchmodule.Mine')


def write_plugin(directory, entry_value: str) -> None:
  """An installed-looking plugin: a package plus the dist-info pip would have written."""
  (directory / 'myplugin').mkdir()
  (directory / 'myplugin' / '__init__.py').write_text('')
  (directory / 'myplugin' / 'exps.py').write_text(USER_MODULE.replace('Mine', 'PluginMine'))
  info = directory / 'myplugin-0.3.dist-info'
  info.mkdir()
  (info / 'METADATA').write_text('Metadata-Version: 2.1\nName: myplugin\nVersion: 0.3\n')
  (info / 'entry_points.txt').write_text(f'[paxlike.experiments]\nmine = {entry_value}\n')


def test_entry_point_plugins_register_and_list_their_origin(user_module):
  write_plugin(user_module, 'myplugin.exps')
  importlib.invalidate_caches()
  registry.import_all()
  assert registry.get('PluginMine').__module__ == 'myplugin.exps'
  line = next(l for l in registry.listing().splitlines() if l.startswith('myplugin.exps.'))
  assert line.split() == ['myplugin.exps.PluginMine', 'plugin', 'myplugin', '0.3', 'My', 'tiny',
                          'LM:', 'seven', 'steps.']
  assert 'lm.StdlibTiny' in registry.listing()


def test_a_broken_plugin_is_skipped_with_a_warning(user_module, capsys):
  write_plugin(user_module, 'myplugin.missing')
  importlib.invalidate_caches()
  registry.import_all()
  assert 'skipping plugin myplugin 0.3 (myplugin.missing): ModuleNotFoundError' in capsys.readouterr().err
  assert 'lm.StdlibTiny' in registry.keys()


def test_listing_shows_origin_and_first_docstring_paragraph():
  line = next(l for l in registry.listing().splitlines() if l.startswith('lm.StdlibTiny '))
  assert line.split(None, 2)[1:] == ['paxlike', registry.summary('lm.StdlibTiny')]
  assert registry.summary('lm.StdlibTiny') == (
      "The default job: a 2-layer byte LM on this interpreter's standard library source.")


def test_a_users_own_configs_and_experiments_packages_clash_with_nothing(tmp_path):
  """paxlike installs one top-level package, so a user's `configs` (first on sys.path) is
  theirs, paxlike's experiments still load, and their `experiments` package's key is theirs."""
  for package in ('configs', 'experiments'):
    (tmp_path / package).mkdir()
    (tmp_path / package / '__init__.py').write_text('')
  (tmp_path / 'configs' / 'models.py').write_text('LAYERS = 3\n')
  (tmp_path / 'experiments' / 'mine.py').write_text(USER_MODULE.replace(
      'model.num_layers = 1', 'from configs.models import LAYERS\n    model.num_layers = LAYERS'))
  for exp, layers in (('lm.StdlibTiny', '2'), ('experiments.mine.Mine', '3')):
    proc = subprocess.run([sys.executable, '-m', 'paxlike.main', f'--exp={exp}',
                           '--mode=print_config'], cwd=tmp_path, env=user_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f'model.num_layers = {layers}\n' in proc.stdout
