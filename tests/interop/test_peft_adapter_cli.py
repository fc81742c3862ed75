"""train.init_from=hf:ADAPTER through the CLI: the run takes the adapter's rank, alpha and
targets, its first loss is the merged model's, init_source.json records both directories, the
HF export writes W + s·B·A; an adapter whose base is not local is one line, exit 2, naming
what to pass."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest
from safetensors.numpy import save_file

from paxlike.interop import checkpoint
from paxlike.trainer import losses
from tests.helpers import TINY, metric_rows, run_cli, run_python, cli_env
from tests.interop import peft_adapters
from tests.tiny_task import SMALL, tiny_task

pytestmark = pytest.mark.slow


def write_base(directory, model) -> dict[str, np.ndarray]:
  """An HF dir of `model` with random weights (not its init); returns its tensors."""
  boxed = jax.jit(model.init)(jax.random.key(3), np.zeros((1, 8), np.int32))['params']
  params = jax.tree.map(lambda x: np.asarray(x) + np.float32(0.05), nn.meta.unbox(boxed))
  tensors = checkpoint.export_params(params, model)
  directory.mkdir(parents=True)
  save_file(tensors, str(directory / 'model.safetensors'))
  (directory / 'config.json').write_text(json.dumps(checkpoint.config_to_hf(model)))
  return tensors


def start(tmp_path, source, *more):
  return run_cli(*TINY, *(f'--fdl_set={o}' for o in SMALL), f'--job_log_dir={tmp_path / "job"}',
                 f'--fdl_set=train.init_from=hf:{source}', *more, check=False)


def test_a_run_starts_from_the_adapter_on_its_base_and_exports_it_merged(tmp_path):
  task = tiny_task()
  tensors = write_base(tmp_path / 'base', task.model)
  adapted = peft_adapters.modules(tensors, ('q_proj', 'v_proj'))
  lora = peft_adapters.write(tmp_path / 'adapter', tensors, adapted, str(tmp_path / 'base'),
                             r=4, alpha=8)
  # The base's generation config: the job dir keeps the base's files, not the adapter dir's.
  (tmp_path / 'base' / 'generation_config.json').write_text(json.dumps({'eos_token_id': 7}))
  proc = start(tmp_path, tmp_path / 'adapter', '--fdl_set=train.num_steps=1',
               '--fdl_set=train.log_every=1', '--fdl_set=optimizer.learning_rate.peak_value=0.0')
  assert proc.returncode == 0, proc.stderr[-3000:]
  job = tmp_path / 'job'
  text = (job / 'config.txt').read_text()
  assert 'model.lora_rank = 4' in text and 'model.lora_alpha = 8.0' in text
  record = json.loads((job / 'init_source.json').read_text())
  assert record['path'] == str(tmp_path / 'base') and record['adapter'] == str(
      tmp_path / 'adapter')
  for name in ('config.json', 'generation_config.json'):
    assert (job / 'source' / name).read_text() == (tmp_path / 'base' / name).read_text(), name
  merged = {k: v.astype(np.float32) for k, v in peft_adapters.merged(tensors, lora, 4, 8).items()}
  params = checkpoint.import_params(merged, task.model)  # The plain model, the adapter merged.
  batches, _ = task.data.round_batches(task.train.seed, 1)
  direct = float(jax.jit(losses.model_loss_fn(task.model))(
      params, jax.tree.map(lambda x: x[0, 0], batches), None)[0])
  assert metric_rows(job)[0]['loss'] == pytest.approx(direct, rel=1e-5)
  out = tmp_path / 'hf'
  exported = run_python(['-m', 'paxlike.interop.hf', f'--job_log_dir={job}', f'--out={out}'],
                        cli_env(), timeout=300)
  assert exported.returncode == 0, exported.stderr[-2000:]
  written = checkpoint.read_safetensors(out)
  assert set(written) == set(merged)
  for name, value in merged.items():  # A zero learning rate: the adapter as it was loaded.
    np.testing.assert_allclose(written[name], value, rtol=1e-6, atol=1e-6, err_msg=name)


def test_an_adapter_of_a_hub_base_is_one_line_exit_2(tmp_path):
  task = tiny_task()
  tensors = write_base(tmp_path / 'base', task.model)
  peft_adapters.write(tmp_path / 'adapter', tensors, ['model.layers.0.self_attn.q_proj'],
                      'meta-llama/Llama-3.2-1B')
  proc = start(tmp_path, tmp_path / 'adapter')
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1] == (
      f"paxlike: error: train.init_from='hf:{tmp_path / 'adapter'}': {tmp_path / 'adapter'} is a "
      "PEFT LORA adapter (r=4, lora_alpha=8, target_modules=['q_proj']) for the base "
      "'meta-llama/Llama-3.2-1B', which is not a local directory holding a config.json: pass a "
      f"local copy of it as train.init_from=hf:{tmp_path / 'adapter'}@BASE_DIR (nothing is "
      'downloaded)')
  assert not (tmp_path / 'job' / 'config.json').exists()
  explicit = f'{tmp_path / "adapter"}@{tmp_path / "base"}'  # The base given after @.
  proc = start(tmp_path, explicit, '--fdl_set=model.lora_rank=8')
  assert proc.returncode == 2, proc.stderr[-2000:]  # A LoRA of another rank asked for.
  assert proc.stderr.strip().splitlines()[-1] == (
      f"paxlike: error: {tmp_path / 'adapter'} is a LoRA of r=4 (scale 2) on query, but the "
      "model has lora_rank=8, lora_alpha=8.0, lora_targets=('query',): pass "
      "--fdl_set=model.lora_rank=4 --fdl_set=model.lora_alpha=8.0 "
      "\"--fdl_set=model.lora_targets=('query',)\"")
  proc = start(tmp_path, explicit, '--fdl_set=train.num_steps=1')
  assert proc.returncode == 0 and f'initialised from hf:{explicit}' in proc.stderr, \
      proc.stderr[-2000:]
