"""A saved config cannot run code: only what configs are made of may be named in one.

Each payload below is a real serialized task config with one field replaced by a call that has
side effects (unpickling a file whose pickle runs a shell command, writing a file, eval, exec,
open), or by a route to `os.system` through a module that is importable for other reasons. Each
is refused, naming the symbol, before anything is called.
"""

import json
import pickle
from pathlib import Path

import fiddle as fdl
import numpy as np
import pytest

from paxlike import registry
from paxlike.config import allow_list, config_io
from paxlike.errors import UserError
from tests.test_bad_input import assert_one_line_error, paxlike_main  # noqa: F401 (fixture)


class _Shell:
  """Unpickling this runs `touch MARKER`."""

  def __init__(self, marker: Path):
    self.marker = marker

  def __reduce__(self):
    import os
    return (os.system, (f'touch {self.marker}',))


def _stand_in(*args, **kwargs):
  """Serialized in place of the payload's callable, then renamed to it (Fiddle cannot
  serialize numpy's dispatchers or builtins, but a hand-written config.json can name them)."""
  del args, kwargs


def _payload(module: str, name: str, *args, **kwargs) -> str:
  """The default experiment's config JSON with `train.seed` a call of `module.name(*args,
  **kwargs)`."""
  registry.import_all()
  cfg = registry.get('lm.StdlibTiny')().config()
  cfg.train.seed = fdl.Config(_stand_in, *args, **kwargs)
  return _with_pyref(config_io.to_json(cfg), __name__, '_stand_in', module, name)


def _with_pyref(text: str, module: str, name: str, new_module: str, new_name: str) -> str:
  doc = json.loads(text)
  hits = 0

  def walk(node):
    nonlocal hits
    if isinstance(node, dict):
      if node.get('type') == 'pyref' and (node['module'], node['name']) == (module, name):
        node['module'], node['name'] = new_module, new_name
        hits += 1
      for v in node.values():
        walk(v)
    elif isinstance(node, list):
      for v in node:
        walk(v)

  walk(doc)
  assert hits, f'{module}.{name} is not in the config'
  return json.dumps(doc)


@pytest.fixture
def pickle_payload(tmp_path) -> tuple[Path, Path]:
  """(a .npy file holding a pickle that runs a shell command, the file the command creates)."""
  marker = tmp_path / 'pwned'
  path = tmp_path / 'payload.npy'
  np.save(path, np.array([_Shell(marker)], dtype=object), allow_pickle=True)
  return path, marker


def test_the_pickle_payload_is_real(pickle_payload):
  """The payload does run a command when loaded as the config asks: what the refusal stops."""
  path, marker = pickle_payload
  np.load(path, allow_pickle=True)
  assert marker.exists()


def test_numpy_load_of_a_pickle_is_refused(pickle_payload):
  path, marker = pickle_payload
  text = _payload('numpy', 'load', str(path), allow_pickle=True)
  with pytest.raises(UserError, match=r'names numpy\.load, which a config may not use'):
    config_io.from_json(text, 'evil.json')
  assert not marker.exists()


@pytest.mark.parametrize('module, name', [
    ('builtins', 'eval'), ('builtins', 'exec'), ('builtins', 'open'), ('builtins', '__import__'),
    ('builtins', 'getattr'), ('numpy', 'save'), ('jax.numpy', 'save'), ('numpy', 'fromfile'),
    ('paxlike.data.prepare', 'make_builder'), ('paxlike.trainer.job_dir', 'record_config'),
    ('fiddle', 'build'), ('flax.linen', 'tabulate'),
    # Routes to os.system and friends through modules a config may import:
    ('numpy.lib._npyio_impl', 'os.system'),  # The route the issue found.
    ('paxlike.trainer.job_dir', 'os.system'), ('optax', 'tree_utils.os.system'),
    ('paxlike.layers.transformer', 'jax.numpy.save'), ('paxlike.experiments.lm', 'fdl.build'),
])
def test_calls_with_effects_and_routes_to_them_are_refused_by_name(module, name):
  text = _payload(module, name, 'x.npy', 1)
  with pytest.raises(UserError, match=rf'names {module}\.{name}, which a config may not use'):
    config_io.from_json(text, 'evil.json')


def test_every_registered_experiment_still_round_trips():
  registry.import_all()
  for key in registry.keys():
    cfg = registry.get(key)().config()
    assert config_io.from_json(config_io.to_json(cfg), key) == cfg


def test_dtypes_and_builtin_containers_stay_allowed():
  import jax.numpy as jnp
  for obj in (jnp.bfloat16, jnp.float32, np.float32, tuple, dict):
    assert allow_list.refusal(obj) is None


def test_print_config_of_a_numpy_save_payload_writes_nothing(paxlike_main, tmp_path):
  target = tmp_path / 'written.npy'
  evil = tmp_path / 'evil.json'
  evil.write_text(_payload('numpy', 'save', str(target), 1))
  assert_one_line_error(*paxlike_main(f'--fdl_config={evil}', '--mode=print_config'),
                        'names numpy.save, which a config may not use')
  assert not target.exists()


def test_training_from_a_pickle_payload_runs_nothing(paxlike_main, pickle_payload, tmp_path):
  path, marker = pickle_payload
  evil = tmp_path / 'evil.json'
  evil.write_text(_payload('numpy', 'load', str(path), allow_pickle=True))
  assert_one_line_error(*paxlike_main(f'--fdl_config={evil}', f'--job_log_dir={tmp_path / "j"}'),
                        'names numpy.load')
  assert not marker.exists() and not (tmp_path / 'j').exists()


@pytest.mark.parametrize('fiddler', ['numpy.save', 'os.system', 'builtins.exec',
                                     'paxlike.trainer.job_dir.record_config'])
def test_fiddlers_come_from_configs_or_allowed_modules_only(paxlike_main, fiddler):
  assert_one_line_error(*paxlike_main('--exp=lm.StdlibTiny', f'--fdl_fiddler={fiddler}',
                                      '--mode=print_config'), 'is not allowed')
