"""Every user error: exit code 2, one line on stderr, and the job dir left exactly as it was.

Most cases run the CLI's entry point in this process (absl's app.run with paxlike's flag parser,
as `python -m paxlike.main` does); a few run the real CLI, for the process's own exit code and
stderr (and the 8-device mesh).
"""

import os
import shutil
import sys
from pathlib import Path
from typing import Callable

import pytest
from absl import app

from paxlike import main
from tests.helpers import TINY, cli_env, run_cli, snapshot


@pytest.fixture(scope='module')
def job(tmp_path_factory) -> Path:
  """A finished tiny run: the existing job dir every bad command must leave alone."""
  path = tmp_path_factory.mktemp('job')
  run_cli(*TINY, f'--job_log_dir={path}')
  return path


@pytest.fixture
def paxlike_main(capsys, monkeypatch) -> Callable[..., tuple[int, str]]:
  """`paxlike_main(*args)`: the CLI's entry point on `args` in this process; returns its exit
  code and what it wrote to stderr."""
  # main.exit_with ends the process with os._exit (skipping teardown); here it becomes the
  # SystemExit that sys.exit raises, after exit_with has printed its line.
  monkeypatch.setattr(os, '_exit', sys.exit)

  def run(*args: str) -> tuple[int, str]:
    capsys.readouterr()
    main.FLAGS.unparse_flags()
    with pytest.raises(SystemExit) as exited:
      app.run(main.main, argv=['paxlike', *args], flags_parser=main.parse_flags)
    return exited.value.code, capsys.readouterr().err

  return run


def assert_one_line_error(code: int, stderr: str, message: str) -> None:
  """Exit 2 and a single `paxlike: error: ...` line on stderr that contains `message`."""
  assert code == 2, stderr[-2000:]
  lines = stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('paxlike: error: '), stderr[-2000:]
  assert message in lines[0]


CASES = {
    'unknown exp': (['--exp=lm.StdlibTyni'], "unknown experiment 'lm.StdlibTyni'; did you mean"),
    'empty exp': (['--exp='], '--exp is empty'),
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
    'unknown fiddler': ([*TINY, '--fdl_fiddler=huge'], "fiddlers has no 'huge'"),
    'fiddler off the allow-list': ([*TINY, '--fdl_fiddler=os.system'], 'is not allowed'),
}


@pytest.mark.parametrize('name', CASES)
def test_user_error_leaves_the_job_dir_alone(job, paxlike_main, name):
  args, message = CASES[name]
  before = snapshot(job)
  assert_one_line_error(*paxlike_main(*args, f'--job_log_dir={job}'), message)
  assert snapshot(job) == before


def test_no_exp_beside_a_job_dir_without_a_saved_config(tmp_path, paxlike_main):
  assert_one_line_error(*paxlike_main(f'--job_log_dir={tmp_path}'),
                        f'--job_log_dir {tmp_path} holds no config.json (train first), so '
                        '--exp is required')
  assert not any(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.parametrize('name', ['unknown exp', 'unknown flag'])
def test_the_real_cli_exits_2_with_one_line(job, name):
  """The process itself: an error before any JAX work, and one in absl's flag parsing."""
  args, message = CASES[name]
  before = snapshot(job)
  proc = run_cli(*args, f'--job_log_dir={job}', check=False)
  assert_one_line_error(proc.returncode, proc.stderr, message)
  assert snapshot(job) == before


@pytest.mark.slow
def test_the_real_cli_eval_without_a_checkpoint(tmp_path):
  """After the step is compiled and Orbax has looked for checkpoints: still only one line."""
  proc = run_cli(*TINY, f'--job_log_dir={tmp_path}', '--mode=eval', check=False)
  assert_one_line_error(proc.returncode, proc.stderr, 'no checkpoint in')


@pytest.mark.slow
def test_mesh_that_does_not_divide_the_batch(tmp_path):
  proc = run_cli(*TINY, '--fdl_set=data.batch_size=12', '--fdl_set=data.eval_batch_size=16',
                 f'--job_log_dir={tmp_path / "job"}', devices=8, check=False)
  assert_one_line_error(proc.returncode, proc.stderr,
                        "batch size 12 does not divide over mesh axes ('data',) of total size 8")
  assert not (tmp_path / 'job').exists() or not any((tmp_path / 'job').iterdir())


def test_missing_data_file_says_where_to_get_it(paxlike_main, monkeypatch, tmp_path):
  (tmp_path / 'empty').mkdir()
  monkeypatch.setenv('PAXLIKE_DATA_DIR', str(tmp_path / 'empty'))
  monkeypatch.setenv('PAXLIKE_TFDS_DIR', str(tmp_path / 'tfds'))
  code, stderr = paxlike_main('--exp=lm.ShakespeareTiny', '--fdl_fiddler=tiny',
                              f'--job_log_dir={tmp_path / "j"}')
  assert_one_line_error(code, stderr, 'tinyshakespeare/input.txt')
  assert 'char-rnn' in stderr


def test_missing_explicit_data_dir_is_a_one_line_error(paxlike_main, monkeypatch, tmp_path):
  monkeypatch.setenv('PAXLIKE_DATA_DIR', str(tmp_path / 'nowhere'))  # As --data_dir sets it.
  monkeypatch.setenv('PAXLIKE_TFDS_DIR', str(tmp_path / 'tfds'))
  code, stderr = paxlike_main('--exp=lm.ShakespeareTiny', '--fdl_fiddler=tiny',
                              f'--job_log_dir={tmp_path / "j"}')
  assert_one_line_error(code, stderr, f'data dir {tmp_path / "nowhere"} (--data_dir or '
                        '$PAXLIKE_DATA_DIR) does not exist')


def test_job_dir_that_is_a_file_or_unwritable(paxlike_main, tmp_path):
  afile = tmp_path / 'afile'
  afile.write_text('precious')
  assert_one_line_error(*paxlike_main(*TINY, f'--job_log_dir={afile}'),
                        'exists and is not a directory')
  assert afile.read_text() == 'precious'
  assert_one_line_error(*paxlike_main(*TINY, '--job_log_dir=/proc/paxlike_job'), 'is not writable')


@pytest.mark.parametrize('mode', ['train', 'eval'])
@pytest.mark.parametrize('entry, is_dir', [('checkpoints', False), ('summaries', False),
                                           ('metrics.jsonl', True)])
def test_job_dir_entries_of_the_wrong_kind_stop_before_step_1(paxlike_main, tmp_path, mode,
                                                              entry, is_dir):
  """A stray `checkpoints` file used to be found at the first save, after training every step
  (and rewriting metrics.jsonl)."""
  (tmp_path / 'metrics.jsonl').write_text('{"step": 7, "loss": 1.0}\n') if not is_dir else None
  stray = tmp_path / entry
  stray.mkdir() if is_dir else stray.write_text('not a checkpoint')
  before = snapshot(tmp_path)
  assert_one_line_error(*paxlike_main(*TINY, f'--job_log_dir={tmp_path}', f'--mode={mode}'),
                        f'{stray} is not a {"file" if is_dir else "directory"}')
  assert snapshot(tmp_path) == before


@pytest.mark.parametrize('mode', ['eval', 'decode'])
def test_eval_and_decode_need_a_checkpoint(paxlike_main, tmp_path, mode):
  assert_one_line_error(*paxlike_main(*TINY, f'--job_log_dir={tmp_path}', f'--mode={mode}'),
                        'no checkpoint in')
  assert_one_line_error(
      *paxlike_main(*TINY, f'--job_log_dir={tmp_path / "missing"}', f'--mode={mode}'),
      'does not exist; train first')


def test_corrupt_config_json_passed_back_in(job, paxlike_main, tmp_path):
  cut = tmp_path / 'config.json'
  cut.write_text((job / 'config.json').read_text()[:-50])
  assert_one_line_error(*paxlike_main(f'--fdl_config={cut}', f'--job_log_dir={tmp_path / "j"}'),
                        'is not valid JSON')
  evil = tmp_path / 'evil.json'
  evil.write_text((job / 'config.json').read_text().replace('"paxlike.core.optim"', '"subprocess"'))
  assert_one_line_error(*paxlike_main(f'--fdl_config={evil}', f'--job_log_dir={tmp_path / "j"}'),
                        "imports 'subprocess', which is not allowed")


@pytest.mark.slow
def test_allow_config_change_lets_a_different_config_resume(job, paxlike_main, tmp_path):
  copy = tmp_path / 'copy'
  shutil.copytree(job, copy)
  changed = [*TINY, '--fdl_set=train.seed=3', '--fdl_set=train.num_steps=25']
  assert_one_line_error(*paxlike_main(*changed, f'--job_log_dir={copy}'), 'train.seed: 0 -> 3')
  run_cli(*changed, '--allow_config_change', f'--job_log_dir={copy}')
  assert '"step": 25' in (copy / 'metrics.jsonl').read_text()
