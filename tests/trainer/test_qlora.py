"""LoRA over a quantized frozen base (QLoRA) through the trainer: a float HF checkpoint is
quantized as it streams in, only the adapters train, runs resume bitwise, the export merges
into the dequantized base, and a quantized base without adapters is refused."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest
from flax import traverse_util

from paxlike.core.trainable import split_params
from paxlike.errors import UserError
from paxlike.layers import quantization
from paxlike.layers.lora import lora_mask
from paxlike.trainer import build, loop
import fiddle as fdl

from paxlike.config import config_io
from paxlike import interop
from paxlike.trainer import restore
from tests.helpers import TINY, cli_env, run_cli, run_python
from tests.tiny_task import SMALL, restored, tiny_task, with_steps
from tests.trainer.test_init_from import fresh_start, write_hf_dir

# Kernels NF4 can block: head dim 64, MLP width 128.
SHAPE = ['model.d_model=128', 'model.num_heads=2', 'model.num_kv_heads=1', 'model.d_ff=128']


def quantized_task(tmp_path, kind, *extra):
  source = write_hf_dir(tmp_path / 'hf', tiny_task(*SHAPE).model)
  task = tiny_task(*SHAPE, 'model.lora_rank=4', f'model.base_quantization={kind!r}',
                   f'train.init_from=hf:{tmp_path / "hf"}', 'train.checkpoint_every=1',
                   'train.max_to_keep=5', *extra)
  return task, source


@pytest.mark.parametrize('kind', ['int8', 'nf4'])
def test_a_float_checkpoint_is_quantized_as_it_streams_in(tmp_path, kind):
  task, source = quantized_task(tmp_path, kind)
  placed = build.setup(task, train_step=False, evaluator=False)
  _, state, _ = fresh_start(placed, tmp_path)
  params = jax.device_get(nn.meta.unbox(state.alg.params))
  base = traverse_util.flatten_dict(split_params(params, lora_mask)[1], sep='/')
  want = traverse_util.flatten_dict(quantization.quantize_tree(source, kind), sep='/')
  assert sorted(base) == sorted(want)
  for name, value in want.items():
    np.testing.assert_array_equal(base[name], value, err_msg=name)
  assert base['block_0/attention/query/' + ('int8' if kind == 'int8' else 'nf4')].dtype == (
      np.int8 if kind == 'int8' else np.uint8)


@pytest.fixture(scope='module')
def nf4_placed(tmp_path_factory):
  task, _ = quantized_task(tmp_path_factory.mktemp('src'), 'nf4')
  return build.setup(task)


def test_only_the_adapters_train_over_an_nf4_base(nf4_placed, tmp_path):
  loop.train(with_steps(nf4_placed, 3), tmp_path)
  start, end = restored(nf4_placed, tmp_path, 1), restored(nf4_placed, tmp_path, 3)
  base1, base3 = (split_params(s.alg.params, lora_mask)[1] for s in (start, end))
  assert [np.asarray(x).tobytes() for x in jax.tree.leaves(base3)] == [
      np.asarray(x).tobytes() for x in jax.tree.leaves(base1)]
  adapters1, adapters3 = (split_params(s.alg.params, lora_mask)[0] for s in (start, end))
  assert all(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(adapters3),
                                                      jax.tree.leaves(adapters1)))
  # AdamW's moments of the adapters only.
  adapter_bytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(adapters1))
  state_bytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(end.alg.opt_state))
  assert 2 * adapter_bytes <= state_bytes < 2 * adapter_bytes + 64


def test_an_nf4_run_resumes_bitwise(nf4_placed, tmp_path):
  loop.train(with_steps(nf4_placed, 3), tmp_path / 'whole')
  loop.train(with_steps(nf4_placed, 2), tmp_path / 'parts')
  loop.train(with_steps(nf4_placed, 3), tmp_path / 'parts')
  a = restored(nf4_placed, tmp_path / 'whole', 3)
  b = restored(nf4_placed, tmp_path / 'parts', 3)
  assert [np.asarray(x).tobytes() for x in jax.tree.leaves(a)] == [
      np.asarray(x).tobytes() for x in jax.tree.leaves(b)]


def test_a_quantized_base_without_adapters_is_refused():
  task = tiny_task(*SHAPE, "model.base_quantization='int8'")
  with pytest.raises(UserError, match='set model.lora_rank > 0'):
    build.setup(task)


@pytest.mark.slow
def test_the_cli_fine_tunes_an_int8_base_and_exports_what_it_computes(tmp_path):
  """Train 2 steps over an int8 base from an HF dir, export: the exported float checkpoint
  (adapters merged into the dequantized base) computes the job's quantized model's logits."""
  write_hf_dir(tmp_path / 'hf', tiny_task(*SHAPE).model)
  job = tmp_path / 'job'
  run_cli(*TINY, *(f'--fdl_set={o}' for o in [*SMALL, *SHAPE]), f'--job_log_dir={job}',
          f'--fdl_set=train.init_from=hf:{tmp_path / "hf"}', '--fdl_set=model.lora_rank=4',
          "--fdl_set=model.base_quantization='int8'", '--fdl_set=train.num_steps=2')
  proc = run_python(['-m', 'paxlike.interop.hf', f'--job_log_dir={job}',
                     f'--out={tmp_path / "out"}'], cli_env(), 300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  cfg, exported = interop.load_hf_checkpoint(tmp_path / 'out')
  float_model = fdl.build(cfg)
  assert float_model.base_quantization == 'none' and float_model.lora_rank == 0
  task = config_io.build(config_io.load_file(job / 'config.json', []))
  _, params = restore.load_latest_params(task, job)
  tokens = np.random.default_rng(0).integers(0, 256, (2, 16)).astype(np.int32)
  want = jax.jit(task.model.apply)({'params': jax.device_get(params)}, tokens)
  got = jax.jit(float_model.apply)({'params': exported}, tokens)
  np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
