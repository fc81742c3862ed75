"""Kills, preemption, corrupt checkpoints, NaNs and bad input: nothing committed is ever lost."""

import random
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.helpers import TINY, made_once, metric_rows, run_cli, snapshot, start_cli

pytestmark = pytest.mark.slow

# 40 steps, a checkpoint every 5 and a row every 2: many places for a kill to land.
LONG = [*TINY, '--fdl_set=train.num_steps=40', '--fdl_set=train.checkpoint_every=5',
        '--fdl_set=train.log_every=2']


def committed_steps(job: Path) -> list[int]:
  return sorted(int(p.name) for p in (job / 'checkpoints').iterdir() if p.name.isdigit())




def max_logged_step(job: Path) -> int:
  try:
    lines = (job / 'metrics.jsonl').read_text().splitlines()
  except FileNotFoundError:
    return 0
  steps = [int(line.split(',')[0].split(':')[1]) for line in lines if line.endswith('}')]
  return max(steps, default=0)


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory) -> Path:
  return made_once(tmp_path_factory, 'reliability-long',
                   lambda job: run_cli(*LONG, f'--job_log_dir={job}'))


@pytest.fixture(scope='module')
def tiny_job(tmp_path_factory) -> Path:
  """A finished 20-step run with checkpoints at 10 and 20 (copy it before changing it)."""
  return made_once(tmp_path_factory, 'reliability-tiny',
                   lambda job: run_cli(*TINY, f'--job_log_dir={job}'))


@pytest.mark.parametrize('trial', range(3))
def test_sigkill_at_a_random_moment_then_restart_gives_identical_rows(uninterrupted, tmp_path, trial):
  rng = random.Random(trial)
  target = rng.randint(1, 38)
  in_save = trial == 0  # One trial aims at an async save in flight.
  proc = start_cli(*LONG, f'--job_log_dir={tmp_path}')
  deadline = time.monotonic() + 120
  while proc.poll() is None and time.monotonic() < deadline:
    ckpt = tmp_path / 'checkpoints'
    saving = ckpt.exists() and any('tmp' in p.name for p in ckpt.iterdir())
    if (in_save and saving) or (not in_save and max_logged_step(tmp_path) >= target):
      proc.kill()
      break
    time.sleep(0.002)
  proc.wait(timeout=60)
  assert proc.returncode == -signal.SIGKILL, 'the run ended before the kill'
  killed_at = max_logged_step(tmp_path)
  run_cli(*LONG, f'--job_log_dir={tmp_path}')
  assert metric_rows(tmp_path) == metric_rows(uninterrupted), f'killed after step {killed_at}'
  assert not any('tmp' in p.name for p in (tmp_path / 'checkpoints').iterdir())


def test_sigterm_saves_the_current_step_and_exits_zero(tmp_path):
  never = ['--fdl_set=train.num_steps=100000', '--fdl_set=train.checkpoint_every=100000']
  err = tmp_path.parent / f'{tmp_path.name}.stderr'
  proc = start_cli(*TINY, *never, f'--job_log_dir={tmp_path}', stderr=err)  # No periodic save.
  deadline = time.monotonic() + 120
  while max_logged_step(tmp_path) < 7 and time.monotonic() < deadline:
    time.sleep(0.01)
  proc.send_signal(signal.SIGTERM)
  proc.wait(timeout=60)
  stderr = err.read_text()
  assert proc.returncode == 0, stderr[-2000:]
  [saved] = committed_steps(tmp_path)
  assert f'SIGTERM: saved step {saved}, exiting' in stderr
  assert saved >= 7
  proc = run_cli(*TINY, *never, f'--job_log_dir={tmp_path}', '--mode=eval')
  assert f'"step": {saved}' in proc.stdout


def test_stale_temp_dir_is_ignored_and_cleaned(tiny_job, tmp_path):
  job = tmp_path / 'job'
  shutil.copytree(tiny_job, job)
  stale = job / 'checkpoints' / '30.orbax-checkpoint-tmp'
  (stale / 'state').mkdir(parents=True)
  (stale / 'state' / 'junk').write_bytes(b'\0' * 100)
  proc = run_cli(*TINY, '--fdl_set=train.num_steps=30', f'--job_log_dir={job}')
  assert 'resumed from checkpoint step 20' in proc.stderr
  assert not stale.exists()
  assert committed_steps(job)[-1] == 30


def _damage(step_dir: Path) -> None:
  for path in step_dir.joinpath('state').rglob('*'):
    if path.is_file() and path.stat().st_size > 0 and '_METADATA' not in path.name:
      path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])


def test_corrupt_committed_step_is_named_and_fallback_is_opt_in(tiny_job, tmp_path):
  job = tmp_path / 'job'
  shutil.copytree(tiny_job, job)
  _damage(job / 'checkpoints' / '20')
  before = snapshot(job)
  proc = run_cli(*TINY, f'--job_log_dir={job}', check=False)
  assert proc.returncode == 1
  last = proc.stderr.strip().splitlines()[-1]  # Tensorstore's threads may log above it.
  assert last.startswith('paxlike: failed: checkpoint step 20 in ') and '--restore_fallback' in last
  assert snapshot(job) == before
  proc = run_cli(*TINY, f'--job_log_dir={job}', '--restore_fallback')
  assert 'resumed from checkpoint step 10' in proc.stderr
  assert committed_steps(job) == [10, 20]  # 20 retrained, the damaged one kept aside:
  assert (job / 'checkpoints.corrupt' / '20' / 'state').is_dir()
  assert metric_rows(job) == metric_rows(tiny_job)


def test_every_step_corrupt_is_an_error_unless_from_scratch(tiny_job, tmp_path):
  job = tmp_path / 'job'
  shutil.copytree(tiny_job, job)
  _damage(job / 'checkpoints' / '10')
  _damage(job / 'checkpoints' / '20')
  before = snapshot(job)
  for fallback in ('--restore_fallback', '--restore_fallback=previous'):
    proc = run_cli(*TINY, f'--job_log_dir={job}', fallback, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f'paxlike: failed: every checkpoint step in {job / "checkpoints"} is unreadable (steps 20, '
        '10); pass --restore_fallback=from_scratch to move them aside and start from step 0')
    assert snapshot(job) == before
  proc = run_cli(*TINY, f'--job_log_dir={job}', '--restore_fallback=from_scratch')
  assert 'resumed' not in proc.stderr
  assert sorted(p.name for p in (job / 'checkpoints.corrupt').iterdir()) == ['10', '20']
  assert committed_steps(job) == [10, 20]
  assert metric_rows(job) == metric_rows(tiny_job)


def test_restore_checks_shapes_against_the_model(tiny_job, tmp_path):
  job = tmp_path / 'job'
  shutil.copytree(tiny_job, job)
  before = snapshot(job)
  proc = run_cli(*TINY, '--fdl_set=model.d_ff=256', '--allow_config_change',
                 f'--job_log_dir={job}', check=False)
  assert proc.returncode == 2
  assert proc.stderr.startswith('paxlike: error: checkpoint step 20: alg.params.block_0.mlp')
  assert 'did the model change?' in proc.stderr
  assert snapshot(job) == before


def test_restore_refuses_a_checkpoint_from_another_data_position(tiny_job, tmp_path):
  """Checkpoints of seed 0 under a config.json that says seed 7 (say, copied from another job):
  the config check passes, the checkpoint's own data position does not."""
  from paxlike.config import config_io
  job = tmp_path / 'job'
  shutil.copytree(tiny_job, job)
  cfg = config_io.load_file(job / 'config.json')
  cfg.train.seed = 7
  (job / 'config.json').write_text(config_io.to_json(cfg))
  before = snapshot(job)
  proc = run_cli(*TINY, '--fdl_set=train.seed=7', f'--job_log_dir={job}', check=False)
  assert proc.returncode == 2 and proc.stderr.count('\n') == 1, proc.stderr
  assert proc.stderr.startswith("paxlike: error: checkpoint step 20 was saved at data position "
                                "{'seed': 0, 'next_step': 21}, but this run continues at "
                                "{'seed': 7, 'next_step': 21}")
  assert snapshot(job) == before


def test_restore_onto_other_meshes(tiny_job, tmp_path):
  saved = tmp_path / 'saved'
  # Stopped at 10 of the 20 steps `tiny_job` ran: its schedule is the 20-step one.
  run_cli(*TINY, '--fdl_fiddler=cpu8', '--fdl_set=train.num_steps=10',
          '--fdl_set=optimizer.learning_rate.decay_steps=20', f'--job_log_dir={saved}', devices=8)
  # The job's saved 4x2 mesh is the base of the resume; each run sets the mesh it has.
  for name, devices, mesh in (('8x1', 8, ['--fdl_set=mesh.ici=(8, 1)']),
                              ('1', 1, ['--fdl_set=mesh.ici=(-1, 1)'])):
    job = tmp_path / name
    shutil.copytree(saved, job)
    proc = run_cli(*TINY, *mesh, f'--job_log_dir={job}', devices=devices)
    assert 'resumed from checkpoint step 10' in proc.stderr
    got, want = metric_rows(job), metric_rows(tiny_job)
    assert [r['step'] for r in got] == [r['step'] for r in want]
    assert [r['loss'] for r in got] == pytest.approx([r['loss'] for r in want], rel=1e-4)


def test_nonfinite_loss_stops_with_the_step_and_keeps_the_checkpoint(tiny_job, tmp_path):
  job = tmp_path / 'job'
  shutil.copytree(tiny_job, job)
  before = snapshot(job / 'checkpoints')
  bad_lr = ['--fdl_set=optimizer.learning_rate.peak_value=1e30', '--allow_config_change']
  proc = run_cli(*TINY, '--fdl_set=train.num_steps=40', *bad_lr, f'--job_log_dir={job}', check=False)
  assert proc.returncode == 1
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('paxlike: failed: non-finite gradient at step 22: loss=')
  assert snapshot(job / 'checkpoints') == before
  proc = run_cli(*TINY, '--fdl_set=train.num_steps=30', '--fdl_set=train.skip_nonfinite=True',
                 *bad_lr, f'--job_log_dir={job}')
  rows = metric_rows(job)
  assert rows[-1]['step'] == 30 and rows[-1]['nonfinite_steps'] >= 5


def test_torn_last_metrics_row_is_dropped_on_resume_and_noted_once(tiny_job, tmp_path):
  job = tmp_path / 'job'
  shutil.copytree(tiny_job, job)
  shutil.rmtree(job / 'checkpoints' / '20')  # Killed while writing row 15, long before step 20:
  lines = (job / 'metrics.jsonl').read_text().splitlines()
  (job / 'metrics.jsonl').write_text(lines[0] + '\n' + lines[1] + '\n' + lines[2][:40])
  proc = run_cli(*TINY, f'--job_log_dir={job}')
  assert 'resumed from checkpoint step 10' in proc.stderr
  assert proc.stderr.count('torn line') == 1  # Noted once (the job's path, printed too, says torn).
  assert 'dropped 1 torn line of metrics.jsonl, cut short by a crash' in proc.stderr
  assert metric_rows(job) == metric_rows(tiny_job)


def test_torn_config_json_is_refused_without_a_change(tiny_job, tmp_path):
  job = tmp_path / 'job'
  shutil.copytree(tiny_job, job)
  config = job / 'config.json'
  config.write_text(config.read_text()[:300])
  before = snapshot(job)
  proc = run_cli(*TINY, f'--job_log_dir={job}', check=False)
  assert proc.returncode == 2
  assert proc.stderr.startswith(f'paxlike: error: {config} is damaged (') and proc.stderr.count('\n') == 1
  assert 'perhaps cut short by a crash' in proc.stderr
  assert snapshot(job) == before
