"""A GRPO job on a tokenizer file resumes as a DPO job does: kill -9 mid-run, then
`--job_log_dir` alone gives the rows of an uninterrupted run bitwise (its prompt data's
fingerprint hashes the tokenizer's bytes, not its path, which the first start points at the
job's own copy); and a job dir moved after that (`mv run run2`) still resumes, evaluates,
decodes and exports, with a reward function from the user's own module, and its samples.jsonl
is the uninterrupted run's byte for byte; a reward function that returns strings is refused by
name, exit 2."""

import json
import os
import signal
import time

import fiddle as fdl
import jax
import numpy as np
import pytest

from tests.helpers import (REPO, cli_env, committed_steps, metric_rows, run_cli,
                           run_python, start_cli)
from tests.tokenizers.chat_fixtures import write_chat_tokenizer

pytestmark = pytest.mark.slow

STEPS = 6
REWARD = ('def length(prompts, completions):\n'
          '  return [float(len(c)) / 8 for c in completions]\n')


@pytest.fixture(scope='module')
def root(tmp_path_factory):
  from paxlike.data import arithmetic_synth
  root = tmp_path_factory.mktemp('grpo_resume')
  write_chat_tokenizer(root / 'tok', None, {'eos_token': '<|im_end|>',
                                            'pad_token': '<|endoftext|>'})
  arithmetic_synth.write_rows(root / 'sums.jsonl', arithmetic_synth.addition_rows(200))
  (root / 'my_rewards.py').write_text(REWARD)
  return root


def env(root):
  return cli_env(PYTHONPATH=f'{REPO}{os.pathsep}{root}')


def args(root) -> list[str]:
  return ['--exp=lm.GrpoTiny', '--fdl_fiddler=tiny', f'--fdl_set=data.files={root}/sums.jsonl',
          f'--fdl_set=data.tokenizer={root}/tok/tokenizer.json',
          '--fdl_set=model.vocab_size=384', f'--fdl_set=train.num_steps={STEPS}',
          '--fdl_set=train.checkpoint_every=2', '--fdl_set=train.log_every=1',
          '--fdl_set=train.eval_every=3', '--fdl_set=data.batch_size=2',
          '--fdl_set=loss.num_generations=4', '--fdl_set=data.num_eval_batches=1',
          '--fdl_set=data.eval_batch_size=4', '--allow_import=my_rewards',
          "--fdl_set=loss.reward_fns=('my_rewards.length',)"]


@pytest.fixture(scope='module')
def whole(root):
  job = root / 'whole'
  run_cli(*args(root), f'--job_log_dir={job}', env=env(root))
  return job


def test_kill_9_then_job_log_dir_alone_then_moved_gives_the_uninterrupted_rows(root, whole,
                                                                               tmp_path):
  rows = metric_rows(whole)
  assert [r['step'] for r in rows] == list(range(1, STEPS + 1))
  assert len({r['reward'] for r in rows}) > 1 and any(r['loss'] != 0 for r in rows)
  run = tmp_path / 'run'
  proc = start_cli(*args(root), f'--job_log_dir={run}', env=env(root))
  deadline = time.monotonic() + 240
  while proc.poll() is None and time.monotonic() < deadline and not committed_steps(run):
    time.sleep(0.01)
  proc.kill()
  proc.wait(timeout=60)
  assert proc.returncode == -signal.SIGKILL, 'the run ended before the kill'
  assert committed_steps(run) and committed_steps(run)[-1] < STEPS
  moved = tmp_path / 'run2'
  run.rename(moved)  # Killed, then moved: --job_log_dir alone continues it.
  run_cli(f'--job_log_dir={moved}', '--allow_import=my_rewards', env=env(root))
  assert metric_rows(moved) == rows
  assert (moved / 'samples.jsonl').read_bytes() == (whole / 'samples.jsonl').read_bytes()
  assert str(moved / 'source' / 'tokenizer.json') in (moved / 'config.txt').read_text()
  evals = json.loads(run_cli(f'--job_log_dir={moved}', '--mode=eval',
                             '--allow_import=my_rewards', env=env(root)).stdout)
  assert evals['step'] == STEPS and evals['eval_loss'] == rows[-1]['eval_loss']
  assert evals['eval_reward'] == rows[-1]['eval_reward']  # Greedy: the params' alone.
  out = run_cli(f'--job_log_dir={moved}', '--mode=decode', '--prompt=12+3=',
                '--decode_length=3', '--allow_import=my_rewards', env=env(root)).stdout
  assert out.startswith('12+3=')
  proc = run_python(['-m', 'paxlike.interop.hf', f'--job_log_dir={moved}',
                     f'--out={tmp_path / "hf"}', '--allow_import=my_rewards'], env(root), 300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert (tmp_path / 'hf' / 'tokenizer.json').read_bytes() == (
      root / 'tok' / 'tokenizer.json').read_bytes()


def test_samples_log_each_steps_completions_rewards_and_advantages(whole):
  rows = metric_rows(whole)
  samples = [json.loads(line) for line in (whole / 'samples.jsonl').read_text().splitlines()]
  assert [s['step'] for s in samples] == [step for step in range(1, STEPS + 1) for _ in range(8)]
  for row in rows:  # B * G = 8 completions a step, all of them logged (at most 16).
    mine = [s for s in samples if s['step'] == row['step']]
    assert all(s['reward'] == len(s['completion']) / 8 for s in mine)
    assert np.mean([s['reward'] for s in mine], dtype=np.float32) == pytest.approx(
        row['reward'], rel=1e-6)
    for group in (mine[:4], mine[4:]):  # A group's advantages: centred, over one prompt.
      assert len({s['prompt'] for s in group}) == 1
      assert abs(sum(s['advantage'] for s in group)) < 1e-4
      best = max(group, key=lambda s: s['reward'])
      assert best['advantage'] == max(s['advantage'] for s in group)


def greedy_text(model, params, tok, prompt: np.ndarray, new: int, stop: int) -> str:
  """The reference greedy completion: the whole model (no cache) rerun for each new token,
  cut before the stop token."""
  forward = jax.jit(lambda p, window: model.apply({'params': p}, window))
  ids = list(prompt)
  for _ in range(new):
    window = np.zeros((1, model.max_len), np.int32)
    window[0, :len(ids)] = ids
    token = int(np.asarray(forward(params, window))[0, len(ids) - 1].argmax())
    if token == stop:
      break
    ids.append(token)
  return tok.decode(ids[len(prompt):])


def test_eval_reward_is_the_mean_reward_of_greedy_held_out_completions(root, whole, monkeypatch):
  from paxlike.cli import run_config
  from paxlike.config import config_io
  from paxlike.trainer import grpo_eval, restore
  rows = metric_rows(whole)
  assert [r['step'] for r in rows if 'eval_reward' in r] == [3, 6]
  monkeypatch.syspath_prepend(str(root))  # my_rewards, as the CLI's PYTHONPATH has it.
  task = fdl.build(config_io.with_run_lengths(run_config.run_config(
      str(whole), None, allow_import=['my_rewards'])))
  placed, step, state = restore.load_latest_state(task, whole, evaluator=False)
  assert step == STEPS
  params = jax.device_get(state.alg.params)
  data = task.data
  held = grpo_eval.held_out_rows(data)
  assert len(held) == 4 and set(held.tolist()) <= set(data.split[1].tolist())
  texts = [greedy_text(task.model, params, data.loaded_tokenizer, data.rows.ids[r],
                       task.loss.max_completion_length, data.stop_id()) for r in held.tolist()]
  want = np.mean([len(t) / 8 for t in texts], dtype=np.float32)
  assert rows[-1]['eval_reward'] == pytest.approx(float(want), rel=1e-6)


def test_a_reward_function_returning_strings_is_refused_by_name_exit_2(root, tmp_path):
  (tmp_path / 'text_rewards.py').write_text(
      'def as_text(prompts, completions):\n  return [str(len(c)) for c in completions]\n')
  proc = run_cli(*args(root), "--fdl_set=loss.reward_fns=('text_rewards.as_text',)",
                 '--allow_import=text_rewards', f'--job_log_dir={tmp_path / "job"}',
                 check=False, env=cli_env(PYTHONPATH=f'{REPO}{os.pathsep}{tmp_path}'))
  assert proc.returncode == 2, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("paxlike: error: reward function as_text returned str '")
  assert committed_steps(tmp_path / 'job') == []
