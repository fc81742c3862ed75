"""benchmarks/peers/peft_lora.py and maxtext_step.py: they start without the peers (torch,
transformers, peft and MaxText live only in `make peers`' venv, imported by the children they
time), read each system's own step figures right, and time the paxlike side of the LoRA job
with the adapters the issue names."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

PEERS = {'torch', 'transformers', 'peft', 'maxtext', 'jax'}


def _load(name: str):
  spec = importlib.util.spec_from_file_location(name, REPO / 'benchmarks' / 'peers' / f'{name}.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize('script', ['peft_lora.py', 'maxtext_step.py'])
def test_a_peer_script_runs_its_help_without_any_peer(script):
  proc = subprocess.run([sys.executable, '-X', 'importtime', f'benchmarks/peers/{script}',
                         '--help'], cwd=REPO, capture_output=True, text=True, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert '--peer_python' in proc.stdout
  imported = {line.split('|')[-1].strip() for line in proc.stderr.splitlines() if '|' in line}
  assert not PEERS & imported


def test_maxtext_steps_are_read_from_its_log_after_the_compile_steps():
  mt = _load('maxtext_step')
  seconds = [30.0, 2.0, 0.5, 0.4, 0.8, 0.6]
  log = '\n'.join(f'I1204 metric_logger.py:265] completed step: {n}, seconds: {s:.3f}, '
                  f'TFLOP/s/device: 0.1, loss: 8.0' for n, s in enumerate(seconds))
  assert mt.maxtext_steps_per_sec(log, skip=2, tokens_per_device=2048) == pytest.approx(1 / 0.55)
  with pytest.raises(SystemExit):
    mt.maxtext_steps_per_sec(log, skip=6, tokens_per_device=2048)


def test_maxtext_step_seconds_come_from_its_token_rate_when_the_line_has_one():
  mt = _load('maxtext_step')  # A 8.4 ms step prints as 'seconds: 0.008'.
  log = '\n'.join(f'completed step: {n}, seconds: 0.008, TFLOP/s/device: 3.2, '
                  f'Tokens/s/device: {2048 / 0.0084:.3f}, total_weights: 2048, loss: 7.0'
                  for n in range(5))
  assert mt.maxtext_steps_per_sec(log, skip=3, tokens_per_device=2048) == pytest.approx(
      1 / 0.0084, rel=1e-5)


def test_paxlike_steps_leave_out_the_compile_steps_and_the_final_eval(tmp_path):
  mt = _load('maxtext_step')
  rows = [{'step': 1, 'steps_per_sec': 0.01}, {'step': 2, 'steps_per_sec': 2.0},
          {'step': 3, 'steps_per_sec': 4.0}, {'step': 4, 'steps_per_sec': 3.0},
          {'step': 5, 'steps_per_sec': 0.1, 'eval_loss': 1.0}]
  (tmp_path / 'metrics.jsonl').write_text('\n'.join(json.dumps(r) for r in rows))
  assert mt.paxlike_steps_per_sec(tmp_path, skip=1) == pytest.approx(3.0)


@pytest.mark.parametrize('mesh', ['1dev', 'fsdp8', 'dp8'])
def test_both_systems_train_the_same_global_batch_on_the_same_mesh_axis(mesh):
  mt = _load('maxtext_step')
  devices, axis = mt.MESHES[mesh]
  settings = mt.maxtext_settings('small', mesh, 5, Path('/tmp/x'))
  assert settings['per_device_batch_size'] * devices == mt.MODELS['small']['batch']
  assert settings[f'ici_{axis}_parallelism'] == -1
  args = mt.parse_args(['--model', 'small'])
  sets = mt.paxlike_command(args, mesh, Path('/tmp/x'))
  assert f"--fdl_set=mesh.axes=('{axis}',)" in sets
  assert f"--fdl_set=data.batch_size={mt.MODELS['small']['batch']}" in sets


def test_on_a_gpu_both_systems_run_on_one_device_and_nothing_forces_cpu_devices(capsys):
  mt = _load('maxtext_step')
  assert mt.maxtext_settings('small', '1dev', 5, Path('/tmp/x'), 'gpu')['hardware'] == 'gpu'
  script = 'import os, sys; print(os.environ.get("JAX_PLATFORMS"), os.environ["XLA_FLAGS"])'
  assert mt.run([sys.executable, '-c', script], 1, None, 'gpu').split() == ['None']
  assert mt.run([sys.executable, '-c', script], 8, None, 'cpu').split() == [
      'cpu', '--xla_force_host_platform_device_count=8']
  with pytest.raises(SystemExit):
    mt.parse_args(['--hardware', 'gpu', '--meshes', 'fsdp8'])
  assert 'use --meshes 1dev' in capsys.readouterr().err


def test_the_paxlike_lora_child_trains_only_the_query_and_value_adapters():
  lora = _load('peft_lora')
  proc = subprocess.run([sys.executable, 'benchmarks/peers/peft_lora.py', '--child=paxlike',
                         '--mode=lora', '--threads=1', '--quick'], cwd=REPO, capture_output=True,
                        text=True, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  s = lora.QUICK_SHAPE
  head = s['d_model'] // s['heads']
  per_layer = (s['d_model'] * lora.RANK + lora.RANK * s['heads'] * head       # query A, B
               + s['d_model'] * lora.RANK + lora.RANK * s['kv_heads'] * head)  # value A, B
  assert result['trained_params'] == s['layers'] * per_layer
  assert result['peak_mb'] >= result['after_imports_mb'] > 0
  assert result['ms_per_step'] > 0 and result['last_loss'] < result['first_loss']
