"""Benchmarks, the GPU MFU script and the comparison report: each runs end to end at tiny sizes
and prints what it promises. Timings are never asserted (the machine may be loaded)."""

import json
import os
import subprocess
import sys

import fiddle as fdl
import pytest

from tests.helpers import REPO, cli_env, run_file, run_module, run_python

PNG = b'\x89PNG\r\n\x1a\n'


def run_json(*args: str, timeout: float = 600, env: dict | None = None,
             fork_children: bool = False) -> dict:
  """Runs a benchmark (a module, `python -m benchmarks.NAME` forked as `run_module` does, with
  its own children too when `fork_children`; or an executable script), asserts exit 0 and one
  JSON line."""
  if args[0].endswith('.sh'):
    proc = subprocess.run(list(args), cwd=REPO, text=True, capture_output=True, timeout=timeout,
                          env=env or cli_env(1))
  else:
    proc = run_module(*args, env=env, timeout=timeout, fork_children=fork_children)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.strip().splitlines()
  assert len(lines) == 1, proc.stdout
  return json.loads(lines[0])


@pytest.mark.slow
def test_overhead_compares_the_same_work_on_1_and_8_devices():
  out = run_json('benchmarks.overhead', '--quick', fork_children=True)
  assert out['benchmark'] == 'overhead' and set(out['devices']) == {'1', '8'}
  for devices, row in out['devices'].items():
    assert row['devices'] == int(devices)
    assert row['paxlike_steps_per_sec'] > 0 and row['baseline_steps_per_sec'] > 0
    assert row['ratio'] > 0 and row['paxlike_with_data_steps_per_sec'] > 0
    # A fair comparison: the hand-written step does the same work as paxlike's (same model,
    # loss and optimizer; paxlike's extra metrics, such as the gradient norm, cost ~0.1%).
    flops = row['flops_per_device']
    assert flops['paxlike'] == pytest.approx(flops['baseline'], rel=0.01)
  # Data parallel on 8 devices: each does an eighth of the model's work (plus the replicated
  # optimizer update, ~1% here).
  one, eight = (out['devices'][d]['flops_per_device']['paxlike'] for d in ('1', '8'))
  assert eight == pytest.approx(one / 8, rel=0.05)
  assert out['ratio'] == min(r['ratio'] for r in out['devices'].values())
  # One collective per data-parallel step, as in the hand-written step: the masked loss's
  # target count is all-reduced with the gradients, not on its own before the backward pass.
  assert out['devices']['8']['all_reduces'] == {'paxlike': 1, 'baseline': 1}


@pytest.mark.slow
def test_federated_round_times_real_data_and_its_modes_compute_the_same_round():
  out = run_json('benchmarks.federated_round', '--quick', fork_children=True)
  assert out['benchmark'] == 'federated_round'
  # It times the experiment's own data: a fallback to synthetic bytes (the benchmark's escape
  # hatch when the data layer fails) would time something else, and must fail here.
  assert out['experiment'] == 'federated.ShakespeareFedAvg' and out['data'] == ['real']
  [row] = out['cohorts']
  assert row['cohort'] == 4 and out['ratio'] == row['ratio'] > 0
  assert row['client_chunk'] == 1 and out['goal'] == 1.0  # On CPU, one client at a time.
  for mode in ('paxlike', 'loop', 'vmapped'):
    assert row[f'{mode}_rounds_per_sec'] > 0
    assert row['xla_temp_mb'][mode] > 0 and row['peak_rss_mb'][mode] > 0
  # The default round holds one client's activations, the vmapped one all four.
  assert row['xla_temp_mb']['paxlike'] < row['xla_temp_mb']['vmapped']
  # The three ways of running a round compute the same FedAvg round. Tolerance, relative to the
  # norm of the round's change to the params: the per-client loop sums clients in another
  # order (float32 noise, ~2e-5 observed); the default (chunked) and vmapped rounds run the
  # same client update, one client or all at once.
  difference = row['difference_from_paxlike']
  assert difference['loop']['relative'] < 1e-3
  assert difference['vmapped']['relative'] < 1e-4  # ~5e-6 observed at cohort 16.


def test_checkpoint_cost_saves_in_every_async_window_and_splits_the_extra_time():
  out = run_json('benchmarks.checkpoint_cost', '--quick')
  assert out['benchmark'] == 'checkpoint_cost' and out['ratio'] > 0
  assert out['steps_per_sec'] > 0 and out['baseline_steps_per_sec'] > 0
  # --quick: 1 repeat of 4 steps with a save every 2: the timed async window saved twice.
  assert (out['repeats'], out['steps'], out['every']) == (1, 4, 2) and out['saves'] == 2
  assert out['save_call_ms'] > 0
  # A save costs CPU (Orbax's writers), measured on its own after the windows.
  assert 0 < out['save_cpu_ms'] < 1e4 and 0 < out['save_cpu_share']
  ms = out['step_time_ms']
  assert ms['async'] == pytest.approx(1e3 / out['steps_per_sec'])
  assert ms['none'] == pytest.approx(1e3 / out['baseline_steps_per_sec'])
  # The three parts of the extra time per step add up to it.
  assert sum(out['extra_ms_per_step'].values()) == pytest.approx(ms['async'] - ms['none'])


@pytest.mark.slow
@pytest.mark.bench
def test_cpu_step_times_whole_runs_of_paxlike_and_the_flax_baseline():
  out = run_json('benchmarks.cpu_step', '--quick')
  assert out['benchmark'] == 'cpu_step' and out['steps'] == [2, 4]
  assert out['shape']['mesh'] == [4, 2] and out['shape']['d_ff'] == 512
  # Rates from two run lengths: noisy at 2 extra steps, but both processes ran and exited 0.
  assert set(out['spread']) == {'paxlike', 'flax'} and isinstance(out['goal_met'], bool)
  assert out['ratio'] == pytest.approx(out['steps_per_sec'] / out['flax_steps_per_sec'])
  cpu = out['cpu_ms_per_step']
  assert set(cpu) == {'paxlike', 'flax'}
  assert out['cpu_ratio'] == pytest.approx(cpu['flax'] / cpu['paxlike'])


def test_startup_phases_add_up_to_the_total():
  # Each phase is timed on its own (benchmarks/startup.py), so this sum is a check: it fails
  # if work runs outside every phase or compile time is counted twice or missed.
  out = run_json('benchmarks.startup', '--quick')
  phases = ('interpreter_s', 'import_s', 'init_s', 'compile_s', 'data_s', 'first_step_s')
  assert all(out[k] >= 0 for k in phases) and out['compile_s'] > 0
  assert sum(out[k] for k in phases) == pytest.approx(out['total_s'], abs=0.01)
  assert 0 < out['data_load_s'] <= out['init_s']


def _platform() -> str:
  import jax
  return jax.devices()[0].platform


@pytest.mark.slow
@pytest.mark.bench
def test_accelerator_mfu_quick_times_trainer_and_bare_step_and_the_federated_round():
  """Runs on any host (CPU here, the accelerator on a TPU or GPU host); MFU is model FLOPs ×
  rate / peak."""
  from paxlike.configs.models import lm_125m
  from paxlike.families import lm_flops
  out = run_json('benchmarks.accelerator_mfu', '--quick', '--peak-tflops=0.5')
  default = 'lm.Llama1B' if _platform() == 'gpu' else 'lm.Llama350M'
  assert out['quick'] and out['platform'] == _platform() and out['exp'] == default
  lm, fed = out['lm'], out['federated']
  assert lm['round_shape'] == [1, 1, 8] and lm['tokens_per_step'] == 8 * 32
  assert lm['ratio'] == pytest.approx(lm['trainer_steps_per_sec'] / lm['bare_steps_per_sec'])
  for kind in ('trainer', 'bare'):
    assert lm[f'{kind}_mfu'] == pytest.approx(
        lm['flops_per_step'] * lm[f'{kind}_steps_per_sec'] / 0.5e12)
  kernels = {'gpu': 'cudnn', 'tpu': 'xla'}  # The quick model's seq 32 is no splash block.
  assert lm['attention_kernel'] == kernels.get(_platform(), 'xla')
  # The round counts every client's every local step: 4 clients × 2 steps × 8 × 64 tokens.
  assert fed['round_shape'] == [4, 2, 8] and fed['tokens_per_step'] == 4 * 2 * 8 * 64
  model = fdl.build(lm_125m())
  model = model.clone(num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, d_ff=128,
                      vocab_size=256)
  assert fed['flops_per_step'] == pytest.approx(
      lm_flops.flops_per_token(model, 64) * fed['tokens_per_step'])
  assert fed['trainer_mfu'] == pytest.approx(
      fed['flops_per_step'] * fed['trainer_steps_per_sec'] / 0.5e12)


def test_accelerator_mfu_without_quick_skips_on_cpu():
  if _platform() != 'cpu':
    pytest.skip('an accelerator host runs the full benchmark: benchmarks/device_check.sh')
  out = run_json('benchmarks.accelerator_mfu')
  assert out['benchmark'] == 'accelerator_mfu' and 'skipped' in out
  assert out['exp'] == 'lm.Llama350M'


def test_accelerator_mfu_forced_cudnn_without_a_gpu_is_one_line_exit_2():
  if _platform() == 'gpu':
    pytest.skip('cuDNN is there: the quick run above uses it')
  proc = run_module('benchmarks.accelerator_mfu', '--quick', '--only=bare',
                  '--fdl_set=model.attention_impl=cudnn')
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and lines[-1].startswith('accelerator_mfu: error: '), \
      proc.stderr[-2000:]
  assert 'cuDNN flash attention cannot run here' in lines[-1] and proc.stdout == ''


def test_accelerator_mfu_cuda_sh_dry_run_installs_nothing_and_runs_the_quick_bare_step():
  env = {**cli_env(1), 'GPU_VENV': '/nonexistent/never-created'}
  out = run_json('benchmarks/accelerator_mfu_cuda.sh', '--dry-run', '--python', sys.executable, '--',
                 '--only=bare', '--no-federated', '--peak-tflops=0.5', env=env)
  lm = out['lm']
  assert out['quick'] and lm['bare_steps_per_sec'] > 0
  assert lm['bare_mfu'] == pytest.approx(lm['flops_per_step'] * lm['bare_steps_per_sec'] / 0.5e12)
  assert not os.path.exists('/nonexistent/never-created')


def test_accelerator_mfu_cuda_sh_rejects_bad_arguments():
  proc = subprocess.run(['benchmarks/accelerator_mfu_cuda.sh', '--cuda', '11'], cwd=REPO,
                        text=True, capture_output=True)
  assert proc.returncode == 2 and 'accelerator_mfu_cuda: error' in proc.stderr


@pytest.mark.slow
@pytest.mark.bench
def test_device_check_quick_runs_its_parts_and_prints_one_json_object():
  out = run_json('benchmarks/device_check.sh', '--quick', '--python', sys.executable,
                 '--parts', 'levers,tpu_tests,attention', '--budget', '900')
  assert out['benchmark'] == 'device_check' and out['quick']
  assert set(out['parts']) == {'levers', 'tpu_tests', 'attention'}
  # Interpreted off a TPU: each kernel that builds agrees with XLA's attention in float32
  # within bf16's error; tokamax's variants are errors where tokamax is not installed.
  rows = out['parts']['attention']['rows']
  assert out['parts']['attention']['interpret'] and '2x64/paxlike' in rows
  for name, row in rows.items():
    if 'error' in row:
      assert name.split('/')[1].startswith('tokamax'), (name, row)
      continue
    assert row['fwd_ms'] > 0 and row['fwd_bwd_ms'] > 0 and row['max_abs_err'] < 0.05, (name, row)
  levers = out['parts']['levers']['levers']
  assert set(levers) == {'base', 'remat_full', 'xla_latency_hiding'}
  assert levers['remat_full']['remat_policy'] == 'full' and levers['base']['remat_policy'] == 'dots_attention'
  assert levers['base']['vs_base'] == 1.0
  for row in levers.values():  # The env lever ran in a child process, the others here.
    assert row['bare_steps_per_sec'] > 0 and row['tokens_per_sec'] == pytest.approx(
        row['bare_steps_per_sec'] * 8 * 32)
  tests = out['parts']['tpu_tests']
  if _platform() != 'tpu':
    assert tests['skipped'] >= 2 and tests['passed'] == tests['failed'] == 0, tests
  assert out['parts']['levers']['wall_s'] >= 0


def test_every_lever_names_fields_fiddlers_and_values_that_build():
  """A lever is run only on a TPU, in device time: a misspelt field or fiddler, or a value the
  model refuses (a remat policy it lacks, say), must fail here (on CPU, in a fraction of a
  second each), not there."""
  import argparse
  from benchmarks import accelerator_mfu, levers
  from paxlike.layers import lm_checks
  for model, table in levers.LEVERS.items():
    args = argparse.Namespace(quick=False, model=model)
    for name, lever in table.items():
      task = accelerator_mfu.task_of(levers.MODELS[model][0], list(lever.fiddlers),
                                     levers.overrides(args, name))
      assert task.data.seq_len == 2048, (model, name)
      lm_checks.check_model(task.model, task.data.seq_len)


def test_a_benchmark_reruns_itself_as_its_module_and_a_script_run_by_path_is_told_how():
  import importlib.util
  from benchmarks import common
  spec = importlib.util.find_spec('benchmarks.overhead')
  assert common.rerun(spec, '--child', '--quick') == ['-m', 'benchmarks.overhead', '--child',
                                                      '--quick']
  with pytest.raises(SystemExit, match='python -m benchmarks.NAME'):
    common.rerun(None, '--child')


def test_device_check_records_parts_the_budget_leaves_no_time_for():
  out = run_json('benchmarks/device_check.sh', '--quick', '--python', sys.executable,
                 '--parts', 'mfu_350m,levers', '--budget', '5')
  assert out['parts'] == {'mfu_350m': {'skipped': 'time budget spent'},
                          'levers': {'skipped': 'time budget spent'}}


def test_device_check_rejects_unknown_parts():
  proc = subprocess.run(['benchmarks/device_check.sh', '--parts', 'mfu_350m,nope'], cwd=REPO,
                        text=True, capture_output=True)
  assert proc.returncode == 2 and 'device_check: error: unknown part nope' in proc.stderr


@pytest.mark.slow
@pytest.mark.bench
def test_weak_scaling_quick_grows_cohort_with_devices_and_plots(tmp_path):
  png = tmp_path / 'weak.png'
  out = run_json('benchmarks.weak_scaling', '--quick', f'--png={png}',
                 fork_children=True)
  assert out['benchmark'] == 'weak_scaling' and out['png'] == str(png)
  assert png.read_bytes()[:8] == PNG
  points = out['points']
  assert [(p['devices'], p['cohort']) for p in points] == [(1, 2), (2, 4)]
  assert [p['mesh'] for p in points] == [{'clients': 1, 'data': 1}, {'clients': 2, 'data': 1}]
  for p in points:
    assert p['round_s'] > 0
    assert p['efficiency'] == pytest.approx(points[0]['round_s'] / p['round_s'])
  assert out['min_efficiency'] == min(p['efficiency'] for p in points)


# `python scripts/compare.py ARGS`, forked from the worker's fork server, with its training runs
# forked from it in turn (tests/forked_cli.py) instead of each importing paxlike again.
COMPARE = """
import sys
sys.path.insert(0, 'scripts')
import cli_runs, compare
from tests.forked_cli import ForkServer
cli_runs.START = ForkServer.here().popen
sys.exit(compare.main({args!r}))
"""


@pytest.mark.slow
def test_compare_writes_the_report_and_both_plots(tmp_path):
  args = [f'--out={tmp_path}', '--rounds=3', '--evals=1',
          '--experiments=lm.StdlibTiny,lm.ShakespeareTiny', '--set=model.num_layers=1']
  proc = run_python(['-c', COMPARE.format(args=args)], cli_env(1), timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = (tmp_path / 'report.md').read_text()
  for name in ('lm.StdlibTiny', 'lm.ShakespeareTiny'):
    row = next(line for line in report.splitlines() if line.startswith(f'| {name} |'))
    cells = [c.strip() for c in row.strip('|').split('|')]
    assert cells[1] == 'centralized' and cells[2] == '3' and float(cells[6]) > 0
    assert cells[8] == '0'  # Centralized training communicates nothing.
  for png in ('loss_vs_round.png', 'loss_vs_communication.png'):
    assert (tmp_path / png).read_bytes()[:8] == PNG
  again = run_python(['-c', COMPARE.format(args=args)], cli_env(1), timeout=600)
  assert again.returncode == 0 and again.stderr.count('reusing') == 2


def test_plot_metrics_writes_a_png(tmp_path):
  for name, losses in (('a', (3.0, 2.5, 2.0)), ('b', (3.1, 2.9, 2.4))):
    (tmp_path / name).mkdir()
    rows = [{'step': 10 * (i + 1), 'loss': v, 'eval_loss': v + 0.1} for i, v in enumerate(losses)]
    rows.insert(1, {'step': 15, 'loss': 2.7})  # A train-only row: skipped for eval_loss.
    (tmp_path / name / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  out = tmp_path / 'plots' / 'loss.png'
  proc = run_file('scripts/plot_metrics.py', str(out), str(tmp_path / 'a' / 'metrics.jsonl'),
                  str(tmp_path / 'b' / 'metrics.jsonl'), timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert out.read_bytes()[:8] == PNG
  bad = run_file('scripts/plot_metrics.py', str(out), str(tmp_path / 'a' / 'metrics.jsonl'),
                 '--key=nope', timeout=120)
  assert bad.returncode == 2 and 'nope' in bad.stderr


@pytest.mark.bench
def test_decode_presets_quick_reports_each_batch_and_the_roofline_inputs():
  out = run_json('benchmarks.decode', '--presets', '350m', '--quick',
                 '--quantizations', 'none,int8,nf4')
  preset = out['350m']
  # The quick preset: 2 layers of d 128, vocab 512, bf16 weights (what the roofline reads).
  assert preset['param_dtype'] == 'bfloat16' and preset['none']['param_bytes'] % 2 == 0
  # int8 stores a byte per kernel weight, NF4 about half: the same model in fewer bytes.
  sizes = [preset[k]['param_bytes'] for k in ('none', 'int8', 'nf4')]
  assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 3
  for kind in ('none', 'int8', 'nf4'):
    for batch in ('batch_1', 'batch_2'):
      row = preset[kind][batch]
      assert row['decode_tokens_per_sec'] > 0 and row['ttft_ms'] > 0
      assert ('fraction_of_roofline' in row) == (out['hbm_bytes_per_sec'] is not None)
      if kind != 'none':
        assert row['vs_none'] == pytest.approx(row['decode_tokens_per_sec'] / preset['none'][
            batch]['decode_tokens_per_sec'], rel=1e-3)


@pytest.mark.bench
def test_decode_presets_time_each_layout_on_the_same_weights():
  out = run_json('benchmarks.decode', '--presets', '350m', '--quick', '--quantizations', 'nf4',
                 '--layouts', 'scan,loop,unrolled', '--batches', '1')
  preset = out['350m']
  # Each layout's own cache: one stacked for the scan, one per layer for the loop and unrolled.
  assert preset['nf4']['cache_entries'] == ['blocks']
  assert preset['nf4_loop']['cache_entries'] == ['layer_0', 'layer_1']
  assert preset['nf4_unrolled']['cache_entries'] == ['block_0', 'block_1']
  assert preset['nf4_loop']['param_bytes'] == preset['nf4_unrolled']['param_bytes'] == preset[
      'nf4']['param_bytes']
  for name in ('nf4', 'nf4_loop', 'nf4_unrolled'):
    assert preset[name]['batch_1']['decode_tokens_per_sec'] > 0
    assert 'vs_none' not in preset[name]['batch_1']  # No bf16 row to compare with.
  bad = run_module('benchmarks.decode', '--presets', '350m', '--quick', '--layouts', 'scanned')
  assert bad.returncode == 2 and '--layouts takes scan, loop and unrolled' in bad.stderr


def test_hbm_bandwidth_comes_from_the_device_kind():
  from paxlike.trainer import throughput
  assert throughput.hbm_bytes_per_sec('TPU v5 lite') == 819e9
  assert throughput.hbm_bytes_per_sec('cpu') is None


@pytest.mark.bench
def test_lora_preset_quick_reports_steps_per_sec_of_the_lora_side_only():
  out = run_json('benchmarks.lora', '--preset', '1b', '--sides', 'lora', '--quick')
  assert 'full' not in out and out['model']['preset'] == '1b'
  lora = out['lora']
  assert lora['steps_per_sec'] == pytest.approx(1e3 / lora['ms_per_step'])
  assert lora['tokens_per_sec'] == pytest.approx(lora['steps_per_sec'] * 2 * 32)


@pytest.mark.bench
def test_qlora_quick_reports_each_bases_bytes_step_time_and_profile(tmp_path):
  out = run_json('benchmarks.qlora', '--quick', '--profile', str(tmp_path), '--profile-steps', '1')
  none, int8, nf4 = out['none'], out['int8'], out['nf4']
  # int8 stores a byte per kernel weight, NF4 half a byte: the params shrink in that order.
  assert nf4['param_bytes'] < int8['param_bytes'] < none['param_bytes']
  assert int8['params_vs_none'] == pytest.approx(int8['param_bytes'] / none['param_bytes'])
  assert all(row['ms_per_step'] > 0 and row['xla_bytes'] > row['param_bytes']
             for row in (none, int8, nf4))
  for kind in ('none', 'int8', 'nf4'):  # Where each step's time goes, its trace kept.
    profile = out[kind]['profile']
    assert profile['dir'] == str(tmp_path / kind) and any((tmp_path / kind).rglob('*.xplane.pb'))
    assert profile['ops_ms_per_step'] > 0 and profile['top_ops']
