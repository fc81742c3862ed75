"""GRPO on two processes (jax.distributed over loopback, 2 × 4 forced CPU devices, through
scripts/launch_local.sh) logs the rows of one 8-device process (within test_multihost's 1e-4:
the gradient's sums cross processes in another order) and its samples.jsonl byte for byte:
every process gathers the step's prompts, samples every completion on its own devices, scores
them alike and trains its part of the batch; process 0 alone writes. It was refused before
(exit 2, 'GRPO runs in one process')."""

from __future__ import annotations

import os
import sys

import pytest

from tests.helpers import REPO, cli_env, metric_rows, run_cli
from tests.test_multihost import Job, assert_rows_close

pytestmark = pytest.mark.slow

REWARD = ('def length(prompts, completions):\n'
          '  return [float(len(c)) / 8 for c in completions]\n')


def args(root, job) -> list[str]:
  return ['--exp=lm.GrpoTiny', '--fdl_fiddler=tiny', f'--fdl_set=data.files={root}/sums.jsonl',
          '--fdl_set=train.num_steps=4', '--fdl_set=train.checkpoint_every=2',
          '--fdl_set=train.log_every=1', '--fdl_set=train.eval_every=2',
          '--fdl_set=data.batch_size=8', '--fdl_set=loss.num_generations=2',
          '--fdl_set=loss.max_completion_length=4', '--fdl_set=data.num_eval_batches=1',
          '--fdl_set=data.eval_batch_size=8', '--allow_import=my_rewards',
          "--fdl_set=loss.reward_fns=('my_rewards.length',)", f'--job_log_dir={job}']


def test_two_processes_log_the_rows_and_samples_of_one(tmp_path):
  from paxlike.data import arithmetic_synth
  arithmetic_synth.write_rows(tmp_path / 'sums.jsonl', arithmetic_synth.addition_rows(200))
  (tmp_path / 'my_rewards.py').write_text(REWARD)
  path = f'{REPO}{os.pathsep}{tmp_path}'
  one = tmp_path / 'one'
  run_cli(*args(tmp_path, one), devices=8, env=cli_env(8, PYTHONPATH=path))
  two = tmp_path / 'two'
  (tmp_path / 'launch').mkdir()
  env = {**os.environ, 'PYTHONPATH': path, 'PYTHON': sys.executable}  # As test_multihost's.
  job = Job(['bash', str(REPO / 'scripts' / 'launch_local.sh'), '2', '--',
             *args(tmp_path, two)], tmp_path / 'launch', env)
  try:
    assert job.wait(400) == 0, job.stderr()[-3000:]
  finally:
    job.kill()
  rows = metric_rows(one)
  assert [r['step'] for r in rows] == [1, 2, 3, 4] and 'eval_reward' in rows[-1]
  # As tests/test_multihost.py: the gradient's sums go across processes in another order.
  assert_rows_close(metric_rows(two), rows)
  assert (two / 'samples.jsonl').read_bytes() == (one / 'samples.jsonl').read_bytes()
  assert len((one / 'samples.jsonl').read_text().splitlines()) == 4 * 16
