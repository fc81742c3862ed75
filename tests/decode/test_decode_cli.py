"""`--mode=decode` as a user runs it: one compiled prefill and one loop per run for any
--decode_length and any number of prompts, the parameters alone restored, the greedy tokens
those of the whole model rerun per token on the trained params, the first token's time on
stderr."""

import re

import fiddle as fdl
import jax
import numpy as np
import pytest

from paxlike.cli import decode_text, run_config
from paxlike.config import config_io
from paxlike.tokenizers import load_tokenizer
from paxlike.trainer import restore
from tests.helpers import cli_env, run_cli

TRAIN = ['--exp=lm.StdlibTiny', '--fdl_set=model.num_layers=1', '--fdl_set=model.d_model=32',
         '--fdl_set=model.d_ff=64', '--fdl_set=model.max_len=256', '--fdl_set=data.seq_len=32',
         '--fdl_set=train.num_steps=2', '--fdl_set=train.checkpoint_every=2']


def compile_counts(stderr: str) -> dict[str, int]:
  """How many programs JAX compiled or read from its persistent cache, by function
  (JAX_LOG_COMPILES=1 times both as "XLA compilation"). Lowerings are not counted: a decode whose traces are not yet in
  core.program_store lowers its programs twice (once to keep them), and compiles once."""
  counts = {}
  for name in re.findall(r'Finished XLA compilation of (\S+) in', stderr):
    counts[name] = counts.get(name, 0) + 1
  return counts


def prefill_rows(stderr: str) -> int:
  """The batch rows of the prefill JAX compiled (its int32 tokens [rows, width] argument)."""
  line = re.search(r'Compiling jit\(prefill\) with global shapes and types (.*)', stderr)[1]
  return int(re.search(r'int32\[(\d+),\d+\]', line)[1])


def test_decode_batches_are_the_smallest_power_of_two_that_holds_the_prompts():
  rows = [decode_text.batch_rows(n) for n in (1, 2, 3, 5, 16, 17, 32, 40, 1000)]
  assert rows == [1, 2, 4, 8, 16, 32, 32, 32, 32]


def greedy_rows(model, params, prompts: np.ndarray, steps: int) -> np.ndarray:
  """The reference for prompts of one length [B, P]: the whole model (no cache) rerun on the
  growing rows for every new token."""
  forward = jax.jit(lambda p, window: model.apply({'params': p}, window))
  rows = np.asarray(prompts, np.int32)
  for _ in range(steps):
    window = np.zeros((len(rows), model.max_len), np.int32)
    window[:, :rows.shape[1]] = rows
    logits = np.asarray(forward(params, window))[:, rows.shape[1] - 1]
    rows = np.concatenate([rows, logits.argmax(-1)[:, None].astype(np.int32)], axis=1)
  return rows[:, prompts.shape[1]:]


def decode(job, *args: str):
  return run_cli(f'--job_log_dir={job}', '--mode=decode', '--temperature=0', *args,
                 env=cli_env(JAX_LOG_COMPILES='1'))


@pytest.mark.slow
def test_a_decode_run_compiles_once_for_any_length_and_prompt_count(tmp_path):
  job = tmp_path / 'job'
  run_cli(*TRAIN, f'--job_log_dir={job}')
  task = fdl.build(config_io.with_run_lengths(run_config.run_config(str(job), None)))
  placed, _, state = restore.load_latest_state(task, job, evaluator=False)
  params = jax.device_get(restore.export_params(placed, state))
  bytes_ = load_tokenizer('bytes')
  # 5 tokens fit a 128-slot cache; 200 need 256 slots (the old decoder compiled a loop for each).
  for length in (5, 200):
    run = decode(job, f'--decode_length={length}', '--prompt=def ')
    counts = compile_counts(run.stderr)
    assert (counts.get('jit(prefill)'), counts.get('jit(decode_loop)')) == (1, 1), counts
    assert not {'jit(train_step)', 'jit(step)', 'jit(fresh)'} & set(counts)  # Params alone.
    assert prefill_rows(run.stderr) == 1  # One prompt, one row: no idle rows decoded.
    assert re.search(r'^time to first token: \d+\.\d\d s$', run.stderr, re.M)
    [want] = greedy_rows(task.model, params, np.asarray(bytes_.encode_batch(['def '])), length)
    assert run.stdout == 'def ' + bytes_.decode(want.tolist()) + '\n'
  # 40 prompts: a batch of 32 and one of 8 padded to 32, through the same compiled pair.
  prompts = [f'x{i:02d} = ' for i in range(40)]
  (tmp_path / 'prompts.txt').write_text('\n'.join(prompts) + '\n')
  run = decode(job, '--decode_length=3', f'--prompts_file={tmp_path / "prompts.txt"}')
  counts = compile_counts(run.stderr)
  assert (counts.get('jit(prefill)'), counts.get('jit(decode_loop)')) == (1, 1), counts
  assert prefill_rows(run.stderr) == decode_text.BATCH_SIZE
  want = greedy_rows(task.model, params, np.asarray(bytes_.encode_batch(prompts)), 3)
  assert run.stdout == '\n\n'.join(prompt + bytes_.decode(row.tolist())
                                   for prompt, row in zip(prompts, want)) + '\n'
