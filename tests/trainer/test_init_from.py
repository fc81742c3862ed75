"""train.init_from: a fresh run starts from an HF Llama dir's or another job's params (checked
before step 1, placed tensor by tensor), with a fresh optimizer; a resumed run never re-imports."""

import hashlib
import json
import shutil

import fiddle as fdl
import jax
import numpy as np
import pytest
from safetensors.numpy import save_file

from paxlike.config import config_io
from paxlike.trainer import build, init_from, loop, losses
from paxlike.core.trainable import split_params
from paxlike.trainer.checkpoint import Checkpoints
from paxlike.errors import RunFailure, UserError
from paxlike import interop
from paxlike.layers import stack_layers
from paxlike.layers.lora import lora_mask
from tests.hf_fixtures import random_params
from tests.helpers import TINY, metric_rows, run_cli
from tests.tiny_task import SMALL, tiny_config, tiny_task


def write_hf_dir(directory, model, seed: int = 3):
  """An HF Llama dir for `model` with random weights (not the model's init), and its params."""
  shifted = lambda x: x + np.float32(0.05)  # Far from any fresh init.
  params = jax.tree.map(shifted, random_params(model, seed))
  directory.mkdir(parents=True, exist_ok=True)
  save_file(interop.export_params(params, model), str(directory / 'model.safetensors'))
  (directory / 'config.json').write_text(json.dumps(interop.config_to_hf(model)))
  (directory / 'tokenizer.json').write_text('{}')
  return params


def fresh_start(placed, tmp_path):
  """restore_or_init on an empty checkpoint dir: the fresh (maybe imported) state."""
  checkpoints = Checkpoints(tmp_path / 'empty', 1)
  try:
    return loop.restore_or_init(placed.task, placed.program, checkpoints)
  finally:
    checkpoints.close()


def leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def test_first_step_loss_is_the_imported_models_and_resume_never_reimports(tmp_path):
  task = tiny_task()
  source = write_hf_dir(tmp_path / 'hf', task.model)
  job = tmp_path / 'job'
  args = [*TINY, *(f'--fdl_set={o}' for o in SMALL), f'--job_log_dir={job}',
          f'--fdl_set=train.init_from=hf:{tmp_path / "hf"}', '--fdl_set=train.log_every=1',
          '--fdl_set=train.checkpoint_every=2']
  proc = run_cli(*args, '--fdl_set=train.num_steps=2')
  assert 'initialised from hf:' in proc.stderr
  batches, _ = task.data.round_batches(task.train.seed, 1)
  direct = float(jax.jit(losses.model_loss_fn(task.model))(
      source, jax.tree.map(lambda x: x[0, 0], batches), None)[0])
  assert metric_rows(job)[0]['loss'] == pytest.approx(direct, rel=1e-5)
  assert abs(direct - 5.55) > 0.1  # Not the loss of a fresh init (~ln 256).
  record = json.loads((job / 'init_source.json').read_text())
  digest = hashlib.sha256((tmp_path / 'hf' / 'model.safetensors').read_bytes()).hexdigest()
  assert record['kind'] == 'hf' and record['files']['model.safetensors'] == digest
  assert record['init_from'] == f'hf:{tmp_path / "hf"}' and record['step'] is None
  shutil.rmtree(tmp_path / 'hf')  # Gone: the resumed run must not need it.
  proc = run_cli(*args, '--fdl_set=train.num_steps=3')
  assert 'resumed from checkpoint step 2' in proc.stderr and 'initialised' not in proc.stderr
  assert [r['step'] for r in metric_rows(job)] == [1, 2, 3]
  assert json.loads((job / 'init_source.json').read_text()) == record


def test_missing_source_is_exit_2_in_one_line(tmp_path):
  proc = run_cli(*TINY, *(f'--fdl_set={o}' for o in SMALL), f'--job_log_dir={tmp_path / "j"}',
                 f'--fdl_set=train.init_from=hf:{tmp_path / "nothing"}', check=False)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1].endswith(f'{tmp_path / "nothing"} is not a directory')
  assert not (tmp_path / 'j' / 'config.json').exists()


@pytest.fixture(scope='module')
def source_job(tmp_path_factory):
  """Another job: 2 steps, checkpoints at 1 and 2."""
  job = tmp_path_factory.mktemp('source')
  cfg = tiny_config('train.checkpoint_every=1', 'train.num_steps=2')
  placed = build.setup(config_io.build(cfg))
  loop.train(placed, job)
  (job / 'config.json').write_text(config_io.to_json(cfg))  # As the CLI records it.
  return job, placed


def test_job_source_gives_its_params_and_a_fresh_optimizer(source_job, tmp_path):
  job, source_placed = source_job
  checkpoints = Checkpoints(job / 'checkpoints', 3, read_only=True)
  try:
    saved = {s: checkpoints.restore(source_placed.program.abstract_state, step=s)[1] for s in (1, 2)}
  finally:
    checkpoints.close()
  for spec, step in ((f'job:{job}', 2), (f'job:{job}@1', 1)):
    placed = build.setup(tiny_task(f'train.init_from={spec}'))
    start, state, meta = fresh_start(placed, tmp_path)
    assert (start, meta) == (0, {})
    params = saved[step].alg.params
    assert [x.tobytes() for x in leaves(state.alg.params)] == [x.tobytes() for x in leaves(params)]
    fresh_opt = leaves(placed.task.optimizer.init(params))
    assert [x.tobytes() for x in leaves(state.alg.opt_state)] == [x.tobytes() for x in fresh_opt]
    assert int(state.nonfinite_steps) == 0
    record = init_from.source_record(spec)
    assert record['step'] == step and record['kind'] == 'job'
    assert 'state/manifest.ocdbt' in record['files']
  with pytest.raises(UserError, match='no committed step 7 \\(committed: 1, 2\\)'):
    init_from.load_params(f'job:{job}@7', placed.program.abstract_params, placed.task.model)


def test_job_shape_mismatch_names_the_first_param_and_both_shapes(source_job):
  job, _ = source_job
  placed = build.setup(tiny_task('model.d_ff=96'))
  with pytest.raises(UserError, match=r'block_0/mlp/wi_gate/kernel is \[32, 64\] in job:.* '
                                      r'step 2 but the model needs \[32, 96\]'):
    init_from.load_params(f'job:{job}', placed.program.abstract_params, placed.task.model)


def test_hf_shape_mismatch_and_bad_files(tmp_path):
  placed = build.setup(tiny_task())
  write_hf_dir(tmp_path / 'hf', tiny_task('model.d_ff=96').model)
  with pytest.raises(UserError, match=r'^model\.layers\.0\.mlp\.gate_proj\.weight is \[96, 32\] '
                                      r'in the checkpoint but the model needs \[64, 32\]'):
    init_from.load_params(f'hf:{tmp_path / "hf"}', placed.program.abstract_params, placed.task.model)
  (tmp_path / 'hf' / 'model.safetensors').write_bytes(b'not a safetensors file')
  with pytest.raises(RunFailure, match='model.safetensors is not a readable safetensors file'):
    init_from.load_params(f'hf:{tmp_path / "hf"}', placed.program.abstract_params, placed.task.model)
  (tmp_path / 'hf' / 'model.safetensors').unlink()
  with pytest.raises(UserError, match='no .safetensors files'):
    init_from.load_params(f'hf:{tmp_path / "hf"}', placed.program.abstract_params, placed.task.model)
  with pytest.raises(UserError, match="not 'hf:DIR'"):
    init_from.parse('gs://bucket')


def test_scanned_model_gets_the_layers_stacked(tmp_path):
  placed = build.setup(tiny_task('model.scan_layers=True', 'model.num_layers=2'))
  unrolled = placed.task.model.clone(scan_layers=False)
  source = write_hf_dir(tmp_path / 'hf', unrolled)
  imported = init_from.load_params(f'hf:{tmp_path / "hf"}', placed.program.abstract_params,
                                   placed.task.model)
  want = init_from._flat(stack_layers(source, 2))  # pylint: disable=protected-access
  assert sorted(imported) == sorted(want)
  for name, value in want.items():
    assert np.asarray(imported[name]).tobytes() == value.tobytes(), name
    assert imported[name].sharding == init_from._flat(placed.program.abstract_params)[name].sharding


def test_model_overrides_and_tokenizer(tmp_path, source_job):
  model = tiny_task().model
  write_hf_dir(tmp_path / 'hf', model)
  overrides = init_from.model_overrides_from(f'hf:{tmp_path / "hf"}')
  assert fdl.build(fdl.Config(type(model), **overrides)) == model.clone(
      norm_eps=overrides['norm_eps'], max_len=overrides['max_len'], num_kv_heads=4)
  assert {overrides[k] for k in ('d_model', 'd_ff', 'num_layers')} == {32, 64, 1}
  assert init_from.init_source_tokenizer(f'hf:{tmp_path / "hf"}') == str(
      tmp_path / 'hf' / 'tokenizer.json')
  assert init_from.init_source_tokenizer(None) is None
  job, placed = source_job
  from_job = init_from.model_overrides_from(f'job:{job}')
  assert {k: from_job[k] for k in ('d_model', 'd_ff', 'num_layers')} == {
      'd_model': 32, 'd_ff': 64, 'num_layers': 1}
  assert fdl.build(fdl.Config(type(model), **from_job)) == placed.task.model
  assert init_from.init_source_tokenizer(f'job:{job}') is None  # A byte-level job.


def test_lora_import_fills_the_base_and_keeps_the_adapters_init(tmp_path):
  source = write_hf_dir(tmp_path / 'hf', tiny_task().model)
  placed = build.setup(tiny_task('model.lora_rank=4', f'train.init_from=hf:{tmp_path / "hf"}'))
  _, state, _ = fresh_start(placed, tmp_path)
  with jax.set_mesh(placed.program.mesh):
    fresh = placed.program.init(jax.random.key(placed.task.train.seed))
  adapters, base = split_params(state.alg.params, lora_mask)
  assert [x.tobytes() for x in leaves(base)] == [x.tobytes() for x in leaves(source)]
  assert [x.tobytes() for x in leaves(adapters)] == [
      x.tobytes() for x in leaves(split_params(fresh.alg.params, lora_mask)[0])]
  batches, _ = placed.task.data.round_batches(placed.task.train.seed, 1)
  batch = jax.tree.map(lambda x: x[0, 0], batches)
  lora_loss = jax.jit(losses.model_loss_fn(placed.task.model))(state.alg.params, batch, None)[0]
  base_loss = jax.jit(losses.model_loss_fn(tiny_task().model))(source, batch, None)[0]
  assert float(lora_loss) == pytest.approx(float(base_loss), rel=1e-6)  # B = 0 at the start.
