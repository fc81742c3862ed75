"""paxlike's patches of Flower (paxlike/deploy/flower/flower_patches.py) against the installed
flwr: each fails here when Flower moves, renames or changes what a patch replaces, and a
Flower they were not written for gets one warning and Flower's own waits."""

from __future__ import annotations

import inspect
import json
import time

from tests.helpers import cli_env, run_python


def test_the_installed_flower_is_the_one_the_patches_were_written_for():
  from paxlike.deploy.flower import flower_patches
  assert flower_patches.installed_version() == flower_patches.FLOWER_VERSION
  assert flower_patches.problems() == []


def test_what_each_patch_replaces_is_still_flowers_own_with_the_expected_keywords():
  from flwr.superlink.grid import http_grid
  from flwr.supernode import start_client_internal as loop
  from flwr.supernode.runtime import run_clientapp
  from flwr.supercore.inflatable import inflatable_utils as utils
  assert loop.time is time or loop.time.__name__ == 'time'
  for module, name in ((loop, 'pull_objects'), (http_grid, 'pull_objects'),
                       (run_clientapp, 'pull_and_inflate_object_from_tree')):
    function = getattr(getattr(module, name), 'func', getattr(module, name))
    assert function is getattr(utils, name), (module.__name__, name)
    keywords = inspect.signature(function).parameters
    for keyword in ('initial_backoff', 'backoff_cap'):
      assert keywords[keyword].kind is inspect.Parameter.KEYWORD_ONLY, (name, keyword)
  # The waits the SuperNode patch caps: its loop's sleeps, as Flower wrote them.
  source = inspect.getsource(loop)
  assert source.count('time.sleep(3)') == 1 and source.count('time.sleep(0.5)') == 2


def test_a_target_that_changed_is_named_and_nothing_is_patched(monkeypatch, capsys):
  import flwr
  from flwr.superlink.grid import http_grid

  from paxlike.deploy.flower import flower_patches
  monkeypatch.setattr(flower_patches, '_applied', set())  # A ServerApp ran in this process.
  monkeypatch.setattr(flwr, '__version__', '1.99.0')
  monkeypatch.delattr(http_grid, 'pull_objects')
  found = flower_patches.problems(('server_app',))
  assert found == ['flwr 1.99.0 is installed, the patches are for 1.42.0',
                   'flwr.superlink.grid.http_grid.pull_objects is not '
                   'inflatable_utils.pull_objects']
  assert flower_patches.apply('server_app') is False
  assert not hasattr(http_grid, 'pull_objects') and 'server_app' not in flower_patches._applied
  warning = capsys.readouterr().err.strip()
  assert warning.startswith('paxlike: Flower keeps its own waits (flwr 1.99.0 is installed')
  assert '\n' not in warning


ANOTHER_FLOWER = """
import json, sys, time
import flwr
flwr.__version__ = '1.43.0'
from flwr.supernode import start_client_internal as loop
from paxlike.deploy.flower import flower_patches
print(json.dumps({'applied': flower_patches.apply('supernode', 'client_app'),
                  'untouched': loop.time is time}))
"""


def test_another_flower_version_keeps_flowers_waits_with_one_warning():
  proc = run_python(['-c', ANOTHER_FLOWER], cli_env(), timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert json.loads(proc.stdout) == {'applied': False, 'untouched': True}
  assert proc.stderr.strip().splitlines() == [
      'paxlike: Flower keeps its own waits (flwr 1.43.0 is installed, the patches are for '
      '1.42.0)']
