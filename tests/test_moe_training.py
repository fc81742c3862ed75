"""MoE in the trainer: the loss adds the layers' auxiliary losses, the 8-device expert mesh gives
the 1-device rows, a killed run resumes to the same rows, the memory estimate holds every
expert, bad input and MoE checkpoints are one-line exit-2 errors, and benchmarks/moe.py runs."""

import json
import subprocess
import types
from pathlib import Path

import fiddle as fdl
import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

from paxlike.errors import UserError
from paxlike.families import lm_memory
from paxlike import interop
from paxlike.layers import TransformerLM, moe
from paxlike.trainer import losses
from paxlike.core.partitioning import MeshConfig
from tests.helpers import (kill_after_first_checkpoint, metric_rows, run_cli, run_module,
                           run_script)

# lm.StdlibMoe at test size: one MoE layer of 4 experts (top-2) at d 32, seq 32, batch 8.
SMALL = ['--exp=lm.StdlibMoe', '--fdl_fiddler=tiny', '--fdl_set=model.d_model=32',
         '--fdl_set=model.d_ff=32', '--fdl_set=model.num_heads=2', '--fdl_set=data.seq_len=32',
         '--fdl_set=data.batch_size=8', '--fdl_set=train.num_steps=12',
         '--fdl_set=train.log_every=2', '--fdl_set=train.checkpoint_every=4',
         '--fdl_set=train.eval_every=6']
EXPERT_MESH = ['--fdl_fiddler=cpu8_expert']
MODEL = TransformerLM(vocab_size=64, num_layers=2, d_model=32, num_heads=2, d_ff=32, max_len=16,
                      num_experts=4, experts_per_token=2, capacity_factor=1.0)


def test_the_training_loss_is_cross_entropy_plus_the_weighted_aux_losses():
  tokens = np.random.default_rng(0).integers(0, 64, (4, 17)).astype(np.int32)
  batch = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:], 'mask': np.ones((4, 16), np.float32)}
  # Init, the loss with its gradient, and the plain apply each jitted: a program apiece, not one
  # per op; the cross entropy and the weighted aux losses by hand in float64 numpy.
  params = nn.unbox(jax.jit(MODEL.init)(jax.random.key(0), batch['inputs']))['params']
  loss_fn = losses.model_loss_fn(MODEL)
  (loss, metrics), grads = jax.jit(jax.value_and_grad(lambda p: loss_fn(p, batch, None),
                                                      has_aux=True))(params)
  logits, sown = jax.jit(lambda p: MODEL.apply({'params': p}, batch['inputs'],
                                               mutable=[moe.COLLECTION]))(params)
  logits = np.asarray(logits, np.float64)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  ce = -np.take_along_axis(log_probs, batch['targets'][..., None], -1).mean()
  layers = [sown[moe.COLLECTION][f'block_{i}']['mlp'] for i in range(2)]
  aux = np.mean([0.01 * np.float64(m['aux_loss'][0]) + 1e-3 * np.float64(m['z_loss'][0])
                 for m in layers])
  np.testing.assert_allclose(metrics['moe_aux_loss'], aux, rtol=1e-6)
  np.testing.assert_allclose(loss, ce + aux, rtol=1e-6)
  assert {'moe_balance_loss', 'moe_z_loss', 'moe_dropped_fraction',
          'moe_max_expert_load'} <= set(metrics)
  assert float(np.abs(grads['block_1']['mlp']['router']).max()) > 0


def test_memory_estimate_counts_every_expert():
  """Params per device on 2 data × 4 expert: each expert weight [E, ...] split 4 ways, the rest
  replicated; on one device, all of them: more than a dense model with the same active
  params holds."""
  data = types.SimpleNamespace(seq_len=16, batch_size=8, clients_per_round=1, local_steps=1,
                               rows_per_item=1)
  mesh = MeshConfig(ici=(2, 4), axes=('data', 'expert'))
  task = types.SimpleNamespace(model=MODEL, data=data, optimizer=optax.adamw(1e-3), mesh=mesh)
  # The params' shapes (nothing computed).
  params = nn.unbox(jax.eval_shape(MODEL.init, jax.random.key(0), np.zeros((1, 16), np.int32)))[
      'params']
  flat = jax.tree_util.tree_leaves_with_path(params)
  expert = lambda path, x: 'mlp' in str(path) and x.ndim == 3
  want = sum(x.size * 4 / (4 if expert(path, x) else 1) for path, x in flat)
  est = lm_memory.estimate(task, 8)
  assert est.params == want and est.mesh == {'data': 2, 'expert': 4}
  one = types.SimpleNamespace(**{**vars(task), 'mesh': MeshConfig()})
  assert lm_memory.estimate(one, 1).params == sum(x.size * 4 for _, x in flat)
  dense = types.SimpleNamespace(**{**vars(one), 'model': MODEL.clone(num_experts=0, d_ff=64)})
  assert lm_memory.estimate(dense, 1).params < lm_memory.estimate(one, 1).params
  assert lm_memory.estimate(dense, 1).activations < lm_memory.estimate(one, 1).activations


def _assert_rows_close(got: list[dict], want: list[dict], tol: float = 1e-5) -> None:
  assert [sorted(r) for r in got] == [sorted(r) for r in want]
  for a, b in zip(got, want):
    for key, value in b.items():
      if isinstance(value, float):
        assert abs(a[key] - value) <= tol * max(1.0, abs(value)), (a['step'], key, a[key], value)
      else:
        assert a[key] == value, (key, a[key], value)


@pytest.fixture(scope='module')
def one_device(tmp_path_factory) -> Path:
  job = tmp_path_factory.mktemp('moe1')
  run_cli(*SMALL, f'--job_log_dir={job}')
  return job


@pytest.mark.slow
def test_the_8_device_expert_mesh_gives_the_1_device_rows_and_a_killed_run_resumes_to_them(
    one_device, tmp_path):
  full = tmp_path / 'full'
  run_cli(*SMALL, *EXPERT_MESH, f'--job_log_dir={full}', devices=8)
  rows, want = metric_rows(full), metric_rows(one_device)
  assert len(rows) == 6 and 'eval_loss' in rows[2] and rows[0]['moe_dropped_fraction'] > 0
  assert 0.25 <= rows[-1]['moe_max_expert_load'] < 1  # 4 experts: a quarter is perfect balance.
  _assert_rows_close(rows, want)
  job = tmp_path / 'killed'
  committed = kill_after_first_checkpoint(*SMALL, *EXPERT_MESH, job_dir=job, devices=8)
  assert committed and max(committed) < 12
  run_cli(*SMALL, *EXPERT_MESH, f'--job_log_dir={job}', devices=8)
  assert metric_rows(job) == rows


def _one_line_exit_2(proc: subprocess.CompletedProcess, message: str) -> None:
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
  assert lines[0].startswith('paxlike: error: ') and message in lines[0], lines[0]


@pytest.mark.slow
@pytest.mark.parametrize('args, devices, message', [
    (['--fdl_set=model.experts_per_token=5'], 1,
     'experts_per_token=5 must be between 1 and num_experts=4'),
    ([*EXPERT_MESH, '--fdl_set=model.num_experts=6'], 8,
     "mesh axis 'expert' of size 4 does not divide num_experts=6"),
])
def test_bad_moe_input_is_one_line_exit_2_before_anything_is_written(args, devices, message,
                                                                    tmp_path):
  job = tmp_path / 'job'
  _one_line_exit_2(run_cli(*SMALL, *args, f'--job_log_dir={job}', devices=devices,
                           check=False), message)
  assert not job.exists()


@pytest.mark.parametrize('config, message', [
    ({'model_type': 'deepseek_v3', 'n_routed_experts': 8}, "model_type='deepseek_v3' is not "
     r'supported \(supported: .*mixtral.*qwen2_moe, qwen3, qwen3_moe'),
    ({'model_type': 'dbrx'}, "model_type='dbrx' is not supported"),
    ({'model_type': 'jamba'}, "model_type='jamba' is not supported"),
    ({'model_type': 'llama', 'num_local_experts': 4}, 'field num_local_experts=4 is not supported'),
])
def test_hf_import_refuses_moe_architectures_it_does_not_build_by_name(config, message):
  """Mixtral and Qwen-MoE import (tests/interop/test_moe_families.py); other MoE designs are
  refused, naming what is."""
  hf = {'vocab_size': 256, 'hidden_size': 32, 'num_hidden_layers': 1, 'num_attention_heads': 2,
        'intermediate_size': 64, **config}
  with pytest.raises(UserError, match=message):
    interop.config_from_hf(hf)
  with pytest.raises(UserError, match='cannot be written as llama.*num_experts=4'):
    interop.config_to_hf(MODEL, 'llama')
  assert interop.config_to_hf(MODEL)['model_type'] == 'mixtral'  # Renormalised top-2.


@pytest.mark.slow
def test_finetuning_from_an_unsupported_moe_checkpoint_is_one_line_exit_2(tmp_path):
  source = tmp_path / 'deepseek'
  source.mkdir()
  (source / 'config.json').write_text(json.dumps({
      'model_type': 'deepseek_v3', 'n_routed_experts': 8, 'vocab_size': 256, 'hidden_size': 32,
      'num_hidden_layers': 1, 'num_attention_heads': 2, 'intermediate_size': 64}))
  (source / 'text.txt').write_text('hello world\n')
  proc = run_cli('--exp=lm.FinetuneLlama', f'--fdl_set=train.init_from=hf:{source}',
                 f'--fdl_set=data.files={source}/text.txt', f'--job_log_dir={tmp_path}/job',
                 check=False)
  _one_line_exit_2(proc, "model_type='deepseek_v3' is not supported")
  assert not (tmp_path / 'job').exists()


@pytest.mark.slow
def test_moe_benchmark_quick_prints_the_ratio_against_dense():
  proc = run_module('benchmarks.moe', '--quick', '--devices=2', '--mesh=expert=2',
                    '--experts=4')
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out['benchmark'] == 'moe' and out['mesh'] == {'expert': 2} and out['devices'] == 2
  assert out['ratio'] == out['moe']['ms_per_step'] / out['dense']['ms_per_step'] > 0
  # Same active matmul params but for the router (d × E); all experts held by the MoE.
  assert out['moe']['active_params'] - out['dense']['active_params'] == 32 * 4
  assert out['moe']['params'] > out['dense']['params']
  assert out['moe']['all_to_all'] >= 2 and out['dense']['all_to_all'] == 0
  assert 0 <= out['moe']['moe_dropped_fraction'] < 1


def test_the_one_gpu_moe_size_counts_by_hand():
  """moe_1b: the 350m Llama (373,867,520) plus, in each of its 12 MoE layers, 7 more SwiGLU
  experts of 3·1024·2816 and a router of 1024·8; a token runs 2 experts of each."""
  from paxlike.configs.sizes import MOE_SIZES
  from paxlike.families import lm_flops, shapes
  model = fdl.build(MOE_SIZES['moe_1b'].model())
  moe_layer_extra = 7 * 3 * 1024 * 2816 + 1024 * 8
  assert shapes.param_count(model, seq_len=8) == 373_867_520 + 12 * moe_layer_extra
  assert sum(map(model.is_moe_layer, range(24))) == 12
  dense_matmul = 24 * (4 * 1024**2 + 3 * 1024 * 2816) + 1024 * 32_000
  assert lm_flops.matmul_params(model) == dense_matmul + 12 * (3 * 1024 * 2816 + 1024 * 8)


@pytest.mark.slow
def test_print_config_of_the_moe_size_prints_its_memory_on_one_gpu():
  out = run_cli('--exp=lm.Llama1B', '--fdl_fiddler=size_moe_1b', '--mode=print_config').stdout
  assert '# params: 1,100,628,992' in out
  line = next(l for l in out.splitlines() if l.startswith('# memory per device on 1 devices'))
  total = float(line.split(': ')[1].split(' GB')[0])
  params = float(line.split('params ')[1].split(' ')[0])
  assert params == pytest.approx(1_100_628_992 * 4 / 1e9, abs=0.01) and 20 < total < 141


SHARDED_SCRIPT = '''
import json, re
import flax.linen as nn, jax, jax.numpy as jnp, numpy as np
from paxlike.layers import TransformerLM
from paxlike.core import partitioning
from paxlike.trainer import losses
from paxlike.core.partitioning import MeshConfig
model = TransformerLM(vocab_size=64, num_layers=2, d_model=32, num_heads=2, d_ff=32, max_len=16,
                      num_experts=4, experts_per_token=2, capacity_factor=1.0, scan_layers=True)
tokens = np.random.default_rng(0).integers(0, 64, (8, 17))
batch = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:], 'mask': np.ones((8, 16), np.float32)}
loss_fn = losses.model_loss_fn(model)
out = {}
for name, cfg in {'one': MeshConfig(ici=(1,)), 'data2_expert4': MeshConfig((2, 4), None,
                  ('data', 'expert')), 'fsdp2_expert2_model2': MeshConfig((2, 2, 2), None,
                  ('fsdp', 'expert', 'model'))}.items():
  mesh = partitioning.make_mesh(cfg, jax.devices()[:1] if name == 'one' else None)
  with jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.rules_for_mesh(cfg.rules, mesh)):
    boxed = jax.eval_shape(model.init, jax.random.key(0), batch['inputs'][:1])['params']
    shard = partitioning.logical_shardings(boxed, mesh, cfg.rules)
    params = jax.jit(lambda k: nn.unbox(model.init(k, batch['inputs'][:1]))['params'],
                     out_shardings=shard)(jax.random.key(0))
    data = partitioning.host_to_global(batch, partitioning.eval_batch_sharding(mesh))
    step = jax.jit(jax.value_and_grad(lambda p, b: loss_fn(p, b, None), has_aux=True))
    hlo = step.lower(params, data).compile().as_text()
    (loss, metrics), grads = step(params, data)
    spec = params['blocks']['mlp']['wo'].sharding.spec
  out[name] = {'loss': float(loss), 'metrics': {k: float(v) for k, v in metrics.items()},
               'grads': [np.asarray(g).tolist() for g in jax.tree.leaves(grads)],
               'all_to_all': len(re.findall(r'= [^=]*all-to-all(?:-start)?[(]', hlo)),
               'wo_spec': str(spec)}
print(json.dumps(out))
'''


@pytest.mark.slow
def test_expert_composes_with_data_fsdp_and_model():
  """The loss, routing statistics and gradients on 2 data × 4 expert and on 2 fsdp × 2 expert
  × 2 model equal one device's (1e-5) with the experts' weights split on 'expert'; on data ×
  expert XLA moves the slots with all-to-alls (dispatch and combine, forward and backward; on
  the 3-axis mesh XLA:CPU picks collective-permutes and all-gathers instead)."""
  out = json.loads(run_script(SHARDED_SCRIPT).strip().splitlines()[-1])
  one = out.pop('one')
  assert one['all_to_all'] == 0
  for name, got in out.items():
    np.testing.assert_allclose(got['loss'], one['loss'], rtol=1e-5, err_msg=name)
    for key, value in one['metrics'].items():
      np.testing.assert_allclose(got['metrics'][key], value, rtol=1e-5, atol=1e-7, err_msg=key)
    for g, want in zip(got['grads'], one['grads']):
      np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-6, err_msg=name)
    assert "'expert'" in got['wo_spec'], (name, got['wo_spec'])
  assert out['data2_expert4']['all_to_all'] == 4  # The scanned layer body, compiled once.
