import copy
import re

import pytest

from paxlike import registry
from paxlike.config import config_io
from paxlike.trainer import job_dir
from paxlike.errors import UserError


@pytest.fixture
def cfg():
  registry.import_all()
  return registry.get('lm.StdlibTiny')().config()


def test_overrides_reach_the_built_objects(cfg):
  config_io.apply_overrides(cfg, ['train.num_steps=7', 'model.num_layers=3',
                                  'optimizer.learning_rate.peak_value=0.01',
                                  'mesh.ici=(2,)', 'data.dataset=shakespeare'])
  task = config_io.build(cfg)
  assert task.train.num_steps == 7
  assert task.model.num_layers == 3
  assert task.mesh.ici == (2,)
  assert task.data.dataset == 'shakespeare'
  assert float(cfg.optimizer.learning_rate.peak_value) == 0.01


@pytest.mark.parametrize('override, message', [
    ('train.nope=1', 'no such field'),
    ('nope.num_steps=1', 'no such field'),
    ('train.num_steps=ten', 'expected a int'),
    ('train.num_steps=1.5', 'expected a int'),
    ('model.tied_embeddings=1', 'expected a bool'),
    ('train.num_steps', 'not PATH=VALUE'),
    ('=3', 'not PATH=VALUE'),
    ('mesh.ici=(2,', 'cannot parse'),
])
def test_bad_overrides_are_one_line_user_errors(cfg, override, message):
  with pytest.raises(UserError, match=message) as error:
    config_io.apply_overrides(cfg, [override])
  assert '\n' not in str(error.value)


@pytest.mark.parametrize('override, message', [
    ('train.num_steps=0', 'train.num_steps must be a positive integer'),
    ('train.log_every=-5', 'train.log_every must be a positive integer'),
    ('mesh.ici=(0,)', 'mesh: bad shape'),
])
def test_invalid_values_fail_at_build(cfg, override, message):
  config_io.apply_overrides(cfg, [override])
  with pytest.raises(UserError, match=message):
    config_io.build(cfg)


def test_json_round_trip_rebuilds_the_same_config(cfg):
  config_io.apply_overrides(cfg, ['model.d_model=64'])
  loaded = config_io.from_json(config_io.to_json(cfg), 'test')
  assert loaded == cfg
  assert config_io.flatten(loaded) == config_io.flatten(cfg)
  assert config_io.build(loaded).model == config_io.build(cfg).model


@pytest.mark.parametrize('moves', [
    # Saved before the trainer package: the modules at the package root.
    {'paxlike.core.optim': 'paxlike.optim', 'paxlike.trainer.centralized': 'paxlike.centralized',
     'paxlike.core.partitioning': 'paxlike.partitioning'},
    # Saved before the leaf package of contracts: the optimizer presets and mesh in the trainer.
    {'paxlike.core.optim': 'paxlike.trainer.optim',
     'paxlike.core.partitioning': 'paxlike.trainer.partitioning',
     'paxlike.trainer.task': 'paxlike.experiment'},
])
def test_a_config_saved_before_a_move_names_the_old_modules_and_loads(cfg, moves):
  text = config_io.to_json(cfg)
  old = text
  for new_name, old_name in moves.items():
    assert f'"{new_name}"' in old, new_name
    old = old.replace(f'"{new_name}"', f'"{old_name}"')
  assert config_io.from_json(old, 'old.json') == cfg


def test_loading_refuses_modules_off_the_allow_list(cfg):
  text = config_io.to_json(cfg).replace('"paxlike.core.optim"', '"os"')
  with pytest.raises(UserError, match="imports 'os', which is not allowed"):
    config_io.from_json(text, 'evil.json')


def test_corrupt_json_is_a_user_error(cfg):
  with pytest.raises(UserError, match='not valid JSON'):
    config_io.from_json(config_io.to_json(cfg)[:-40], 'cut.json')


def _renamed(text: str, module: str, name: str, new_name: str) -> str:
  """`text` with the pyref `module.name` renamed, as if saved by a paxlike that had it."""
  pattern = rf'("module": "{re.escape(module)}",\s*"name": )"{re.escape(name)}"'
  renamed, count = re.subn(pattern, rf'\1"{new_name}"', text)
  assert count, f'{module}.{name} is not in the config'
  return renamed


def test_a_config_naming_a_removed_function_is_a_stale_config(cfg):
  text = _renamed(config_io.to_json(cfg), 'paxlike.core.optim', 'adamw', 'matched_adamw')
  with pytest.raises(config_io.StaleConfig, match=r'names paxlike\.core\.optim\.matched_adamw, which '
                     'this version of paxlike does not have'):
    config_io.from_json(text, 'old.json')
  gone_module = config_io.to_json(cfg).replace('"paxlike.core.optim"', '"paxlike.configs_v0"')
  with pytest.raises(config_io.StaleConfig, match=r'paxlike\.configs_v0\.adamw'):
    config_io.from_json(gone_module, 'old.json')


def test_a_job_dir_saved_by_an_older_paxlike_resumes_only_when_allowed(cfg, tmp_path, capsys):
  job_dir.record_config(tmp_path, cfg)
  saved = tmp_path / 'config.json'
  saved.write_text(_renamed(saved.read_text(), 'paxlike.core.optim', 'adamw', 'matched_adamw'))
  with pytest.raises(UserError, match='matched_adamw.*pass --allow_config_change to continue'):
    job_dir.prepare(str(tmp_path), cfg, allow_change=False)
  assert job_dir.prepare(str(tmp_path), cfg, allow_change=True) == tmp_path
  assert 'continuing under the current config' in capsys.readouterr().err


def test_differences_ignore_resumable_fields(cfg):
  other = copy.deepcopy(cfg)
  config_io.apply_overrides(other, ['train.num_steps=5000', 'train.log_every=1'])
  assert config_io.differences(cfg, other) == []
  config_io.apply_overrides(other, ['model.d_model=64'])
  assert config_io.differences(cfg, other) == ['model.d_model: 128 -> 64']


def test_dtype_fields_take_dtype_names(cfg):
  import jax.numpy as jnp
  config_io.apply_overrides(cfg, ['model.dtype=bfloat16'])
  assert config_io.build(cfg).model.dtype is jnp.bfloat16
  with pytest.raises(UserError, match='expected one of float32, bfloat16, float16'):
    config_io.apply_overrides(cfg, ['model.dtype=int8'])


def test_none_is_accepted_only_where_the_annotation_allows_it(cfg):
  config_io.apply_overrides(cfg, ['data.num_eval_batches=None', 'model.num_kv_heads=None'])
  assert cfg.data.num_eval_batches is None and cfg.model.num_kv_heads is None
  assert config_io.build(cfg).data.num_eval_batches is None
  for override in ('train.num_steps=None', 'data.seq_len=None'):
    with pytest.raises(UserError, match='expected a int'):
      config_io.apply_overrides(cfg, [override])


def test_a_config_saved_before_textdata_grouped_its_row_fields_loads_into_fields():
  registry.import_all()
  cfg = registry.get('federated.TextFedAvg')().config()
  config_io.apply_overrides(cfg, ['data.partition="field"', 'data.fields.client_field="author"'])
  old = copy.deepcopy(cfg)  # As saved before: the row fields on TextData itself.
  old.data.__arguments__.update(old.data.__arguments__.pop('fields').__arguments__)
  text = config_io.to_json(old)
  assert '"client_field"' in text and '"fields"' not in text
  loaded = config_io.from_json(text, 'old.json')
  assert loaded == cfg
  assert config_io.build(loaded).data.fields.client_field == 'author'
