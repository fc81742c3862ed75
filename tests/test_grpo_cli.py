"""`lm.GrpoTiny` through the CLI, from a short ArithmeticSft run: rows log the rewards, KL,
clipping and completion lengths; kill -9 and a rerun give the uninterrupted rows and
samples.jsonl; the completions a training step samples are what `--mode=decode` continues the
same prompts with at the step's seed; a reward function that is not allowed is one line, exit
2, and one that raises at a step is one line, exit 1, with no checkpoint saved."""

import json
import os

import numpy as np
import pytest

from tests.helpers import (REPO, cli_env, committed_steps, kill_after_first_checkpoint,
                           made_once, metric_rows, run_cli)

pytestmark = pytest.mark.slow

G, B, NEW = 8, 4, 4  # 32 completions a step: --mode=decode's batch of 32 prompts exactly.
# A short SFT gets few sums right: the format reward (an integer) varies within groups.
REWARDS = "('paxlike.trainer.rewards.exact_match','paxlike.trainer.rewards.regex_format')"


@pytest.fixture(scope='module')
def sft(tmp_path_factory):
  def make(root):
    from paxlike.data import arithmetic_synth
    arithmetic_synth.write_rows(root / 'sums.jsonl', arithmetic_synth.addition_rows(600))
    run_cli('--exp=lm.ArithmeticSft', '--fdl_fiddler=tiny', f'--job_log_dir={root / "sft"}',
            f'--fdl_set=data.files={root / "sums.jsonl"}', '--fdl_set=train.num_steps=30',
            env=cli_env(PAXLIKE_TOKEN_DIR=str(root / 'tokens')))
  return made_once(tmp_path_factory, 'grpo_sft', make)


def grpo_args(sft, *extra: str) -> list[str]:
  return ['--exp=lm.GrpoTiny', '--fdl_fiddler=tiny', f'--fdl_set=data.files={sft}/sums.jsonl',
          f'--fdl_set=train.init_from=job:{sft}/sft', '--fdl_set=train.num_steps=8',
          '--fdl_set=train.checkpoint_every=4', '--fdl_set=train.log_every=2',
          '--fdl_set=train.eval_every=4', f'--fdl_set=data.batch_size={B}',
          f'--fdl_set=loss.num_generations={G}', f'--fdl_set=loss.max_completion_length={NEW}',
          '--fdl_set=data.num_eval_batches=1', f'--fdl_set=loss.reward_fns={REWARDS}', *extra]


@pytest.fixture(scope='module')
def whole(sft, tmp_path_factory):
  job = tmp_path_factory.mktemp('grpo_whole')
  run_cli(*grpo_args(sft), f'--job_log_dir={job}')
  return job


def test_rows_log_rewards_kl_clipping_and_lengths(whole):
  rows = metric_rows(whole)
  assert [r['step'] for r in rows] == [2, 4, 6, 8]
  for row in rows:
    assert 0 <= row['reward'] <= row['reward_max'] <= 2  # The sum of two rewards in [0, 1].
    parts = row['reward/exact_match'] + row['reward/regex_format']
    assert parts == pytest.approx(row['reward'], rel=1e-5)
    assert row['kl'] >= 0 and row['clip_ratio'] == 0  # One iteration: the ratio is 1.
    assert 1 <= row['completion_length'] <= NEW
    assert B * G <= row['targets'] <= B * G * NEW  # The step's completion tokens.
  assert rows[0]['kl'] < rows[-1]['kl']  # The policy moves away from the reference.
  assert 'eval_loss' in rows[1] and 'eval_loss' in rows[-1]


def test_kill_9_then_rerun_gives_the_uninterrupted_rows(sft, whole, tmp_path):
  steps = kill_after_first_checkpoint(*grpo_args(sft), job_dir=tmp_path)
  assert steps and steps[-1] < 8
  run_cli(*grpo_args(sft), f'--job_log_dir={tmp_path}')
  assert metric_rows(tmp_path) == metric_rows(whole)
  assert (tmp_path / 'samples.jsonl').read_bytes() == (whole / 'samples.jsonl').read_bytes()


def training_completions(job, step):
  """The prompts and completion texts the GRPO step `step` samples from `job`'s latest
  checkpoint, as the trainer computes them (the loop's round inputs, GrpoStep.rollout)."""
  from paxlike.cli import run_config
  from paxlike.config import config_io
  from paxlike.trainer import grpo_step, loop, restore
  task = config_io.build(run_config.run_config(str(job), None))
  trainer, _, state = restore.load_latest_state(task, job, evaluator=False)
  step_fn, _ = grpo_step.build(trainer.task, trainer.program)
  batches, _, rng = loop.round_inputs(trainer, step)
  assert grpo_step.sampling_seed(rng) == grpo_step.step_sampling_seed(task.train.seed, step)
  scored, _ = step_fn.rollout(state.alg.params, batches, rng)
  inputs, mask = np.asarray(scored['targets'][0, 0]), np.asarray(scored['mask'][0, 0])
  texts = [bytes(row[m > 0].tolist()).decode().rstrip('\n') for row, m in zip(inputs, mask)]
  rows = np.asarray(batches['row'][0, 0]).tolist()
  prompts = [task.data.rows.prompts[r] for r in rows for _ in range(G)]
  return prompts, texts, grpo_step.step_sampling_seed(task.train.seed, step)


def test_training_samples_what_decode_samples_with_the_same_key(whole, tmp_path):
  prompts, texts, seed = training_completions(whole, 9)
  (tmp_path / 'prompts.txt').write_text('\n'.join(prompts) + '\n')
  out = run_cli(f'--job_log_dir={whole}', '--mode=decode', f'--prompts_file={tmp_path}/prompts.txt',
                f'--decode_seed={seed}', '--temperature=1.0', f'--decode_length={NEW}').stdout
  at, decoded = 0, []
  for i, prompt in enumerate(prompts):
    assert out.startswith(prompt, at)
    end = out.find('\n\n' + prompts[i + 1], at + len(prompt)) if i + 1 < len(prompts) else None
    decoded.append(out[at + len(prompt):end].rstrip('\n') if end is None
                   else out[at + len(prompt):end])
    at = end + 2 if end is not None else len(out)
  # Decode of a byte LM runs past the EOS (a newline): the completion is what precedes it.
  assert [d.split('\n')[0] for d in decoded] == texts
  assert len(set(texts)) > 1  # Sampled, not greedy.


def test_a_reward_function_not_allowed_is_one_line_exit_2(sft, tmp_path):
  for name in ('os.system', 'my_rewards.length'):
    proc = run_cli(*grpo_args(sft, f"--fdl_set=loss.reward_fns=('{name}',)"),
                   f'--job_log_dir={tmp_path}', check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f'reward function {name} is not allowed' in proc.stderr.strip().splitlines()[-1]
  assert not os.listdir(tmp_path)


def test_a_reward_function_that_raises_is_one_line_exit_1_and_nothing_saved(sft, tmp_path):
  (tmp_path / 'my_rewards.py').write_text(
      'def broken(prompts, completions):\n  raise ValueError("no score today")\n')
  env = cli_env(PYTHONPATH=f'{REPO}{os.pathsep}{tmp_path}')
  proc = run_cli(*grpo_args(sft, "--fdl_set=loss.reward_fns=('my_rewards.broken',)",
                            '--allow_import=my_rewards'), f'--job_log_dir={tmp_path / "job"}',
                 check=False, env=env)
  assert proc.returncode == 1, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last == ('paxlike: failed: reward function broken raised: ValueError: no score today')
  assert committed_steps(tmp_path / 'job') == []
  saved = json.loads((tmp_path / 'job' / 'config.json').read_text())
  assert 'my_rewards' in json.dumps(saved)  # Saved as a reference: a reload checks it again.
