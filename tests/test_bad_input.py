"""Every user error: exit code 2, one line on stderr, and the job dir left exactly as it was."""

from pathlib import Path

import pytest

from tests.helpers import TINY, cli_env, run_cli, snapshot

pytestmark = pytest.mark.slow


@pytest.fixture(scope='module')
def job(tmp_path_factory) -> Path:
  """A finished tiny run: the existing job dir every bad command must leave alone."""
  path = tmp_path_factory.mktemp('job')
  run_cli(*TINY, f'--job_log_dir={path}')
  return path


CASES = {
    'unknown exp': (['--exp=lm.StdlibTyni'], "unknown experiment 'lm.StdlibTyni'; did you mean"),
    'empty exp': (['--exp='], '--exp is empty'),
    'no exp': ([], '--exp is required'),
    'exp with a path': (['--exp=../../etc/passwd'], "unknown experiment '../../etc/passwd'"),
    'unknown field': ([*TINY, '--fdl_set=model.num_layerz=2'], 'model.num_layerz: no such field'),
    'wrong type': ([*TINY, '--fdl_set=train.num_steps=abc'], 'expected a int'),
    'malformed override': ([*TINY, '--fdl_set=train.num_steps'], 'is not PATH=VALUE'),
    'bad literal': ([*TINY, '--fdl_set=mesh.ici=(1,'], 'cannot parse value'),
    'zero steps': ([*TINY, '--fdl_set=train.num_steps=0'], 'train.num_steps must be a positive'),
    'negative steps': ([*TINY, '--fdl_set=train.num_steps=-5'], 'train.num_steps must be a positive'),
    'zero batch': ([*TINY, '--fdl_set=data.batch_size=0'], 'batch_size'),
    'mesh too big': ([*TINY, '--fdl_fiddler=cpu8'], 'does not divide 1 devices'),
    'bad model': ([*TINY, '--fdl_set=model.num_heads=3'], 'invalid model config'),
    'bad attention': ([*TINY, '--fdl_set=model.attention_impl=flash'], 'attention_impl must be'),
    'unknown mode': ([*TINY, '--mode=trian'], "--mode='trian' is not one of"),
    'unknown flag': ([*TINY, '--num_stepz=3'], 'Unknown command line flag'),
    'other config': ([*TINY, '--fdl_set=model.d_model=64'], 'holds a run with a different config'),
    'unknown fiddler': ([*TINY, '--fdl_fiddler=huge'], 'no such fiddler'),
    'fiddler off the allow-list': ([*TINY, '--fdl_fiddler=os.system'], 'is not allowed'),
}


@pytest.mark.parametrize('name', CASES)
def test_user_error_leaves_the_job_dir_alone(job, name):
  args, message = CASES[name]
  before = snapshot(job)
  proc = run_cli(*args, f'--job_log_dir={job}', check=False)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('paxlike: error: '), proc.stderr[-2000:]
  assert message in lines[0]
  assert snapshot(job) == before


def _one_line_error(proc, message: str) -> None:
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and message in lines[0], proc.stderr[-2000:]


def test_mesh_that_does_not_divide_the_batch(tmp_path):
  proc = run_cli(*TINY, '--fdl_set=data.batch_size=12', '--fdl_set=data.eval_batch_size=16',
                 f'--job_log_dir={tmp_path / "job"}', devices=8, check=False)
  _one_line_error(proc, "batch size 12 does not divide over mesh axes ('data',) of total size 8")
  assert not (tmp_path / 'job').exists() or not any((tmp_path / 'job').iterdir())


def test_missing_data_file_says_where_to_get_it(tmp_path):
  env = cli_env(PAXLIKE_DATA_DIR=str(tmp_path / 'nowhere'), PAXLIKE_TFDS_DIR=str(tmp_path / 'tfds'))
  proc = run_cli('--exp=lm.ShakespeareTiny', '--fdl_fiddler=tiny', f'--job_log_dir={tmp_path / "j"}',
                 env=env, check=False)
  _one_line_error(proc, 'tinyshakespeare/input.txt')
  assert 'char-rnn' in proc.stderr


def test_job_dir_that_is_a_file_or_unwritable(tmp_path):
  afile = tmp_path / 'afile'
  afile.write_text('precious')
  proc = run_cli(*TINY, f'--job_log_dir={afile}', check=False)
  _one_line_error(proc, 'exists and is not a directory')
  assert afile.read_text() == 'precious'
  proc = run_cli(*TINY, '--job_log_dir=/proc/paxlike_job', check=False)
  _one_line_error(proc, 'is not writable')


@pytest.mark.parametrize('mode', ['eval', 'decode'])
def test_eval_and_decode_need_a_checkpoint(tmp_path, mode):
  proc = run_cli(*TINY, f'--job_log_dir={tmp_path}', f'--mode={mode}', check=False)
  _one_line_error(proc, 'no checkpoint in')
  proc = run_cli(*TINY, f'--job_log_dir={tmp_path / "missing"}', f'--mode={mode}', check=False)
  _one_line_error(proc, 'does not exist; train first')


def test_corrupt_config_json_passed_back_in(job, tmp_path):
  cut = tmp_path / 'config.json'
  cut.write_text((job / 'config.json').read_text()[:-50])
  proc = run_cli(f'--fdl_config={cut}', f'--job_log_dir={tmp_path / "j"}', check=False)
  _one_line_error(proc, 'is not valid JSON')
  evil = tmp_path / 'evil.json'
  evil.write_text((job / 'config.json').read_text().replace('"paxlike.optim"', '"subprocess"'))
  proc = run_cli(f'--fdl_config={evil}', f'--job_log_dir={tmp_path / "j"}', check=False)
  _one_line_error(proc, "imports 'subprocess', which is not allowed")


def test_allow_config_change_lets_a_different_config_resume(job, tmp_path):
  import shutil
  copy = tmp_path / 'copy'
  shutil.copytree(job, copy)
  proc = run_cli(*TINY, '--fdl_set=train.seed=3', '--fdl_set=train.num_steps=25',
                 f'--job_log_dir={copy}', check=False)
  _one_line_error(proc, 'train.seed: 0 -> 3')
  run_cli(*TINY, '--fdl_set=train.seed=3', '--fdl_set=train.num_steps=25', '--allow_config_change',
          f'--job_log_dir={copy}')
  assert '"step": 25' in (copy / 'metrics.jsonl').read_text()
