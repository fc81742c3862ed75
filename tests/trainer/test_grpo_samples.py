"""samples.jsonl (paxlike/trainer/grpo_samples.py): each logged step's first completions with
their rewards and advantages, bounded in rows per step and in bytes, and a resume from step c
keeps exactly the complete rows of steps <= c (the CLI's kill -9 test: test_grpo_resume_cli)."""

import json

import numpy as np
import pytest

from paxlike.errors import UserError
from paxlike.trainer.grpo_loss import GrpoLoss
from paxlike.trainer.grpo_samples import FILE, SampleLog, Samples, sample_rows
from paxlike.trainer.task import TrainConfig


def samples(n: int = 8, fns: int = 2) -> Samples:
  each = {f'fn{k}': np.arange(n, dtype=np.float32) * (k + 1) for k in range(fns)}
  return Samples([i // 4 for i in range(n)], [f'p{i // 4}' for i in range(n)],
                 [f'c{i}' for i in range(n)], sum(each.values()).astype(np.float32), each)


def read(path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines()]


def test_rows_hold_the_first_completions_with_their_rewards_and_advantages():
  advantages = np.linspace(-1, 1, 8, dtype=np.float32)
  rows = sample_rows(3, samples(), advantages, limit=5)
  assert [r['completion'] for r in rows] == ['c0', 'c1', 'c2', 'c3', 'c4']
  assert rows[4] == {'step': 3, 'row': 1, 'prompt': 'p1', 'completion': 'c4', 'reward': 12.0,
                     'advantage': float(advantages[4]), 'rewards': {'fn0': 4.0, 'fn1': 8.0}}
  one = sample_rows(3, samples(fns=1), advantages, limit=100)
  assert len(one) == 8 and 'rewards' not in one[0]  # One function: its reward is the reward.


def test_only_logged_steps_write_and_zero_turns_it_off(tmp_path):
  train = TrainConfig(num_steps=7, log_every=3, eval_every=5)
  log = SampleLog(train, limit=2)
  log.open(tmp_path, 0)
  for _ in range(7):
    step = log.next_step()
    if log.due(step):
      log.write(step, samples(), np.zeros(8, np.float32))
  assert [r['step'] for r in read(tmp_path / FILE)] == [3, 3, 5, 5, 6, 6, 7, 7]
  off = SampleLog(train, limit=0)
  off.open(tmp_path / 'off', 0)
  assert not off.due(3)
  with pytest.raises(UserError, match='num_completions_to_log'):
    GrpoLoss(num_completions_to_log=-1)


def test_a_resume_keeps_the_complete_rows_up_to_its_step(tmp_path):
  train = TrainConfig(num_steps=10, log_every=1)
  log = SampleLog(train, limit=3)
  log.open(tmp_path, 0)
  for step in range(1, 6):
    log.write(step, samples(), np.zeros(8, np.float32))
  whole = (tmp_path / FILE).read_text()
  with (tmp_path / FILE).open('a') as f:
    f.write('{"step": 6, "row": 0, "prom')  # A kill mid-write.
  log = SampleLog(train, limit=3)
  log.open(tmp_path, 3)  # Resumed from the checkpoint of step 3.
  assert [r['step'] for r in read(tmp_path / FILE)] == [1] * 3 + [2] * 3 + [3] * 3
  assert log.next_step() == 4
  for step in (4, 5):
    log.write(step, samples(), np.zeros(8, np.float32))
  assert (tmp_path / FILE).read_text() == whole


def test_a_step_that_would_pass_the_cap_writes_nothing(tmp_path):
  train = TrainConfig(num_steps=10, log_every=1)
  block = len(''.join(json.dumps(r) + '\n' for r in
                      sample_rows(1, samples(), np.zeros(8, np.float32), 2)).encode())
  log = SampleLog(train, limit=2, max_bytes=2 * block + block // 2)
  log.open(tmp_path, 0)
  for step in range(1, 5):
    log.write(step, samples(), np.zeros(8, np.float32))
  assert [r['step'] for r in read(tmp_path / FILE)] == [1, 1, 2, 2]
  assert (tmp_path / FILE).stat().st_size <= log.max_bytes
