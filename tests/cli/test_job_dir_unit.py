"""The job dir is the unit: after the first command, resume, eval and decode need only
--job_log_dir (its saved config is the base, flags apply on top), and eval and decode compile
no train step. Also: a schedule's length follows train.num_steps."""

import json
import re
import subprocess
import sys

import fiddle as fdl
import pytest

from paxlike.cli import run_config
from paxlike.config import config_io
from paxlike.errors import UserError
from tests.helpers import REPO, cli_env, metric_rows, run_cli

FIRST = ['--exp=lm.StdlibTiny', '--fdl_set=model.num_layers=1', '--fdl_set=model.d_model=32',
         '--fdl_set=model.d_ff=64', '--fdl_set=data.seq_len=32', '--fdl_set=train.num_steps=4',
         '--fdl_set=train.log_every=2', '--fdl_set=train.checkpoint_every=2',
         '--fdl_set=train.eval_every=4']


def compiled(stderr: str) -> set[str]:
  """The names of the functions JAX compiled (JAX_LOG_COMPILES=1)."""
  return set(re.findall(r'Compiling (\S+?) ', stderr))


@pytest.mark.slow
def test_resume_eval_and_decode_take_only_the_job_dir(tmp_path):
  job = tmp_path / 'job'
  # The runs whose compiles are read have no compilation cache, so no kept program: one loaded
  # from the machine's cache (a config an earlier suite ran) would compile nothing and log
  # nothing, and a train step that eval loaded from there would pass unseen.
  env = cli_env(JAX_LOG_COMPILES='1')
  env.pop('JAX_COMPILATION_CACHE_DIR', None)  # The suite's shared cache (as test_compile_cache).
  uncached = '--compilation_cache_dir='
  run_cli(*FIRST, f'--job_log_dir={job}')
  # The README's resume: only the steps change; model.num_layers=1 comes from the job dir.
  resumed = run_cli(f'--job_log_dir={job}', '--fdl_set=train.num_steps=6', uncached, env=env)
  assert [r['step'] for r in metric_rows(job)] == [2, 4, 6]
  assert 'jit(train_step)' in compiled(resumed.stderr)  # The log shows what a run compiles.
  evaluated = run_cli(f'--job_log_dir={job}', '--mode=eval', uncached, env=env)
  assert json.loads(evaluated.stdout.splitlines()[-1])['step'] == 6
  decoded = run_cli(f'--job_log_dir={job}', '--mode=decode', '--decode_length=5',
                    '--temperature=0', '--prompt=def ', uncached, env=env)
  assert decoded.stdout.startswith('def ')
  endless = run_cli(f'--job_log_dir={job}', '--mode=decode', '--decode_length=10000000',
                    '--temperature=0', '--prompt=def ')
  assert 'note: --decode_length=10000000 is past what the model attends (max_len=' in endless.stderr
  for proc in (evaluated, decoded):
    assert not {'jit(train_step)', 'jit(_mean_metrics)'} & compiled(proc.stderr)
  assert 'jit(step)' not in compiled(decoded.stderr)  # Nor the evaluator's step.
  # --exp is a check: the same experiment is accepted, another one refused in one line.
  run_cli('--exp=lm.StdlibTiny', f'--job_log_dir={job}', '--mode=eval')
  other = run_cli('--exp=lm.StdlibMoe', f'--job_log_dir={job}', '--mode=eval', check=False)
  assert other.returncode == 2
  assert other.stderr.strip().splitlines() == [
      f'paxlike: error: {job} holds a run of lm.StdlibTiny, not lm.StdlibMoe; drop --exp to '
      'continue it, use another --job_log_dir, or pass --allow_config_change']
  changed = run_cli(f'--job_log_dir={job}', '--fdl_set=model.num_layers=2', check=False)
  assert changed.returncode == 2 and 'model.num_layers: 1 -> 2' in changed.stderr


def test_a_job_dir_without_a_config_asks_for_the_experiment(tmp_path):
  with pytest.raises(UserError, match='holds no config.json .train first., so --exp is required'):
    run_config.run_config(str(tmp_path), None)


def test_the_schedule_decays_over_train_num_steps_unless_set():
  cfg = run_config.run_config(None, 'lm.StdlibTiny', overrides=['train.num_steps=200'])
  schedule = config_io.with_run_lengths(cfg).optimizer.learning_rate
  assert schedule.decay_steps == 200 and 'decay_steps' not in cfg.optimizer.learning_rate.__arguments__
  built = fdl.build(schedule)
  peak = schedule.peak_value
  assert float(built(20)) == pytest.approx(peak)  # Warmup: a tenth of the run.
  assert float(built(110)) == pytest.approx(peak * (0.1 + 0.9 * 0.5), rel=1e-5)  # Cosine's middle.
  assert float(built(200)) == pytest.approx(peak * 0.1)  # Its end value at the run's end.
  assert 'optimizer.learning_rate.decay_steps = 200' in config_io.to_text(cfg)
  fixed = run_config.run_config(None, 'lm.StdlibTiny', overrides=[
      'train.num_steps=200', 'optimizer.learning_rate.decay_steps=1000'])
  assert config_io.with_run_lengths(fixed).optimizer.learning_rate.decay_steps == 1000


def test_a_closed_stdout_pipe_is_not_a_traceback():
  proc = subprocess.Popen([sys.executable, '-m', 'paxlike.main', '--list'], cwd=REPO,
                          env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  proc.stdout.close()  # The reader is gone before the listing is written (`| true`).
  assert proc.wait(timeout=120) == 0
  assert proc.stderr.read() == b''


def test_an_experiment_whose_task_is_not_a_config_is_one_line(tmp_path):
  (tmp_path / 'my_bad_exps.py').write_text(
      'from paxlike import registry\nfrom paxlike.experiment import Experiment\n\n'
      '@registry.register\nclass AsDict(Experiment):\n'
      '  def task(self):\n    return {"model": None}\n\n'
      '  def datasets(self):\n    return None\n')
  env = cli_env()
  env['PYTHONPATH'] = f'{REPO}:{tmp_path}'
  proc = run_cli('--exp=my_bad_exps.AsDict', '--mode=print_config', env=env, check=False)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [
      'paxlike: error: AsDict.task() must return a fdl.Config of paxlike.experiment.Task, got '
      'a dict']
