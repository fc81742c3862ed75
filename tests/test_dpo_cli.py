"""`lm.DpoTiny` through the CLI on a preference set with a learnable signal: DPO raises the
reward margin and the held-out reward accuracy from the tie at step 0; 8 data-parallel devices
(one pair per device) log what one device logs; kill -9 and a rerun give the uninterrupted rows,
with LoRA and as a full fine-tune (its reference a frozen copy of the initial params, in the
checkpoint); a full fine-tune from `init_from` scores against the imported params (step 1's
margin is 0) and decodes; federated DPO (FedAvg of DPO clients over LoRA adapters, a client per
file) learns the same preference; pair data without a preference loss, rows without `chosen` or
`rejected` and rows whose two completions are equal are one line, exit 2."""

import json
import random

import numpy as np
import pytest

from tests.helpers import cli_env, kill_after_first_checkpoint, metric_rows, run_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope='module')
def pairs(tmp_path_factory):
  """Pairs whose chosen completion is a lowercase word and whose rejected one is the same word
  in capitals: one feature (the case) separates them, and held-out words are new."""
  root = tmp_path_factory.mktemp('pairs')
  rng = random.Random(0)
  rows = []
  for i in range(400):
    word = ''.join(rng.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(rng.randint(4, 9)))
    rows.append(json.dumps({'prompt': f'word {i}: ', 'chosen': word, 'rejected': word.upper()}))
  (root / 'pairs.jsonl').write_text('\n'.join(rows) + '\n')
  (root / 'clients').mkdir()
  for client in range(4):  # The same pairs as four clients' files.
    (root / 'clients' / f'c{client}.jsonl').write_text('\n'.join(rows[client::4]) + '\n')
  return root


def dpo_args(pairs, *extra: str) -> list[str]:
  return ['--exp=lm.DpoTiny', '--fdl_fiddler=tiny', f'--fdl_set=data.files={pairs}/pairs.jsonl',
          '--fdl_set=data.seq_len=32', '--fdl_set=data.batch_size=8',
          '--fdl_set=data.eval_batch_size=8', '--fdl_set=data.num_eval_batches=2',
          '--fdl_set=data.eval_fraction=0.1', '--fdl_set=train.checkpoint_every=4',
          '--fdl_set=loss.beta=0.5', *extra]


def env(pairs, devices: int = 1):
  return cli_env(devices, PAXLIKE_TOKEN_DIR=str(pairs / 'tokens'))


@pytest.fixture(scope='module')
def whole(pairs, tmp_path_factory):
  job = tmp_path_factory.mktemp('whole')
  run_cli(*dpo_args(pairs), f'--job_log_dir={job}', env=env(pairs))
  return job


def test_dpo_raises_the_margin_and_the_held_out_reward_accuracy(whole):
  rows = metric_rows(whole)
  assert [r['step'] for r in rows] == [5, 10, 15, 20]
  first, last = rows[0], rows[-1]
  assert last['rewards/margins'] > first['rewards/margins'] > 0
  assert last['loss'] < first['loss'] < np.log(2)
  assert last['rewards/accuracies'] > 0.8
  evals = [r for r in rows if 'eval_loss' in r]
  assert evals[-1]['eval_rewards/accuracies'] > 0.8
  assert evals[-1]['eval_rewards/margins'] > evals[0]['eval_rewards/margins']
  assert 'preference pairs (text): ' in (whole / 'config.txt').read_text()


def test_eight_devices_log_what_one_does(pairs, whole, tmp_path):
  run_cli(*dpo_args(pairs), f'--job_log_dir={tmp_path}', env=env(pairs, devices=8))
  for one, eight in zip(metric_rows(whole), metric_rows(tmp_path), strict=True):
    assert one.keys() == eight.keys()
    for key, value in one.items():
      assert eight[key] == pytest.approx(value, rel=2e-3, abs=2e-4), key


def test_kill_9_then_rerun_gives_the_uninterrupted_rows(pairs, whole, tmp_path, monkeypatch):
  monkeypatch.setenv('PAXLIKE_TOKEN_DIR', str(pairs / 'tokens'))
  steps = kill_after_first_checkpoint(*dpo_args(pairs), job_dir=tmp_path)
  assert steps and steps[-1] < 20
  run_cli(*dpo_args(pairs), f'--job_log_dir={tmp_path}', env=env(pairs))
  assert metric_rows(tmp_path) == metric_rows(whole)


@pytest.fixture(scope='module')
def full(pairs, tmp_path_factory):
  """An uninterrupted full fine-tune's DPO (model.lora_rank=0: the frozen-copy reference)."""
  job = tmp_path_factory.mktemp('full')
  run_cli(*dpo_args(pairs), '--fdl_set=model.lora_rank=0', f'--job_log_dir={job}',
          env=env(pairs))
  return job


def test_full_fine_tune_dpo_learns_and_resumes_exactly_after_kill_9(pairs, full, tmp_path,
                                                                     monkeypatch):
  rows = metric_rows(full)
  assert rows[-1]['rewards/margins'] > rows[0]['rewards/margins'] > 0
  assert [r for r in rows if 'eval_loss' in r][-1]['eval_rewards/accuracies'] > 0.8
  monkeypatch.setenv('PAXLIKE_TOKEN_DIR', str(pairs / 'tokens'))
  steps = kill_after_first_checkpoint(*dpo_args(pairs), '--fdl_set=model.lora_rank=0',
                                      job_dir=tmp_path)
  assert steps and steps[-1] < 20
  run_cli(*dpo_args(pairs), '--fdl_set=model.lora_rank=0', f'--job_log_dir={tmp_path}',
          env=env(pairs))
  assert metric_rows(tmp_path) == rows


def test_full_fine_tune_from_a_job_scores_against_the_imported_params(pairs, full, tmp_path):
  run_cli(*dpo_args(pairs), '--fdl_set=model.lora_rank=0', f'--fdl_set=train.init_from=job:{full}',
          '--fdl_set=train.num_steps=1', '--fdl_set=train.log_every=1', f'--job_log_dir={tmp_path}',
          env=env(pairs))
  first = metric_rows(tmp_path)[0]
  assert first['step'] == 1 and first['rewards/margins'] == 0.0
  assert first['rewards/accuracies'] == 0.5 and first['loss'] == pytest.approx(np.log(2))
  assert first['logps/chosen'] > metric_rows(full)[0]['logps/chosen']  # The tuned params.
  decoded = run_cli(f'--job_log_dir={full}', '--mode=decode', '--prompt=word 3: ',
                    '--decode_length=4', env=env(pairs))
  assert 'word 3: ' in decoded.stdout


@pytest.mark.parametrize('row, message', [
    ({'prompt': 'p', 'chosen': 'c'}, "'rejected' must be a string"),
    ({'prompt': 'p', 'chosen': 'same', 'rejected': 'same'}, 'are equal'),
])
def test_bad_pairs_are_one_line_exit_2(pairs, tmp_path, row, message):
  good = (pairs / 'pairs.jsonl').read_text().splitlines()[:20]
  (tmp_path / 'bad.jsonl').write_text('\n'.join([*good, json.dumps(row)]) + '\n')
  proc = run_cli(*dpo_args(pairs), f'--fdl_set=data.files={tmp_path}/bad.jsonl',
                 f'--job_log_dir={tmp_path}/job', env=cli_env(1, PAXLIKE_TOKEN_DIR=str(tmp_path)),
                 check=False)
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert 'Traceback' not in proc.stderr and 'bad.jsonl:21' in lines[-1] and message in lines[-1]


def test_federated_dpo_over_lora_adapters_learns_the_preference(pairs, tmp_path):
  run_cli('--exp=federated.DpoLoraFedAvg', '--fdl_fiddler=tiny', f'--job_log_dir={tmp_path}',
          f'--fdl_set=data.files={pairs}/clients/*.jsonl', '--fdl_set=data.partition=file',
          '--fdl_set=data.client_field=None', '--fdl_set=data.clients_per_round=2',
          '--fdl_set=data.local_steps=2', '--fdl_set=data.seq_len=32',
          '--fdl_set=data.batch_size=4', '--fdl_set=data.eval_batch_size=8',
          '--fdl_set=data.num_eval_batches=2', '--fdl_set=data.eval_fraction=0.1',
          '--fdl_set=train.num_steps=10', '--fdl_set=loss.beta=0.5', env=env(pairs))
  rows = metric_rows(tmp_path)
  assert [r['step'] for r in rows] == [5, 10] and rows[-1]['clients'] == 2
  assert rows[-1]['rewards/margins'] > rows[0]['rewards/margins'] > 0
  assert rows[-1]['eval_rewards/accuracies'] > 0.75


def test_pair_data_without_a_preference_loss_is_exit_2(pairs, tmp_path):
  proc = run_cli(*dpo_args(pairs), '--fdl_set=loss=None', f'--job_log_dir={tmp_path}',
                 env=env(pairs), check=False)
  assert proc.returncode == 2
  assert 'train with a preference loss' in proc.stderr.strip().splitlines()[-1]
