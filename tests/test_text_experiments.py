"""`lm.TextLM` on a user's own JSONL corpus with a tokenizer trained here, through the CLI: a
kill -9 and a rerun give the uninterrupted rows, and bad input is one line, exit 2."""

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from paxlike.config import config_io
from paxlike.data import token_build
from tests.fixture_data import SHAKESPEARE_SLICE
from tests.helpers import cli_env, metric_rows, run_cli, run_python, start_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope='module')
def corpus(tmp_path_factory) -> dict[str, Path]:
  """Two JSONL files of Shakespeare's speeches (`text`, `speaker`) and a BPE tokenizer trained
  on them by the CLI."""
  root = tmp_path_factory.mktemp('corpus')
  speeches = [s for s in SHAKESPEARE_SLICE.read_text().split('\n\n') if s.strip()]
  for i, part in enumerate((speeches[::2], speeches[1::2])):
    with open(root / f'part{i}.jsonl', 'w') as f:
      for speech in part:
        speaker, _, text = speech.partition(':\n')
        f.write(json.dumps({'speaker': speaker, 'text': text}) + '\n')
  tok = root / 'tok'
  made = run_python(['-m', 'paxlike.tokenizers', 'train', f'--files={root}/*.jsonl',
                     '--vocab_size=500', '--kind=bpe', f'--out={tok}'], cli_env(), timeout=300)
  assert made.returncode == 0, made.stderr[-2000:]
  return {'root': root, 'tokenizer': tok / 'tokenizer.json', 'tokens': root / 'token_store'}


def text_args(corpus: dict[str, Path], *extra: str) -> list[str]:
  return ['--exp=lm.TextLM', '--fdl_fiddler=tiny', f'--fdl_set=data.files={corpus["root"]}/*.jsonl',
          f'--fdl_set=data.tokenizer={corpus["tokenizer"]}', '--fdl_set=data.seq_len=64',
          '--fdl_set=data.batch_size=4', '--fdl_set=data.eval_batch_size=4',
          '--fdl_set=data.num_eval_batches=2', '--fdl_set=data.eval_fraction=0.05',
          '--fdl_set=train.num_steps=24', '--fdl_set=train.checkpoint_every=4',
          '--fdl_set=train.log_every=2', *extra]


def env(corpus: dict[str, Path]) -> dict[str, str]:
  return cli_env(PAXLIKE_TOKEN_DIR=str(corpus['tokens']))


def test_kill_9_then_rerun_gives_the_uninterrupted_rows(corpus, tmp_path, monkeypatch):
  monkeypatch.setenv('PAXLIKE_TOKEN_DIR', str(corpus['tokens']))
  whole, killed = tmp_path / 'whole', tmp_path / 'killed'
  run_cli(*text_args(corpus), f'--job_log_dir={whole}', env=env(corpus))
  rows = metric_rows(whole)
  assert [r['step'] for r in rows] == list(range(2, 25, 2))
  assert rows[-1]['loss'] < rows[0]['loss']  # It learns the corpus.
  task = config_io.build(config_io.load_file(whole / 'config.json'))
  for row in rows:  # The logged target count is the step's unpadded tokens, counted here.
    batch, _ = task.data.round_batches(0, row['step'])
    assert row['targets'] == batch['mask'].sum()
  assert all(0 <= r['data_wait_time_fraction'] < 1 for r in metric_rows(whole, timing=True))
  efficiency = re.search(r'# packing efficiency: (\S+) train', (whole / 'config.txt').read_text())
  assert efficiency and 0.9 < float(efficiency.group(1)) <= 1
  proc = start_cli(*text_args(corpus), f'--job_log_dir={killed}', env=env(corpus))
  deadline = time.monotonic() + 240
  while proc.poll() is None and time.monotonic() < deadline:
    metrics = killed / 'metrics.jsonl'
    if metrics.exists() and metrics.read_text().count('\n') >= 5:  # Past step 10's checkpoint.
      proc.kill()
      break
    time.sleep(0.01)
  proc.wait(timeout=60)
  assert proc.returncode == -signal.SIGKILL, 'the run ended before the kill'
  run_cli(*text_args(corpus), f'--job_log_dir={killed}', env=env(corpus))
  assert metric_rows(killed) == rows


def _one_line(proc: subprocess.CompletedProcess, code: int, message: str) -> None:
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == code, proc.stderr[-2000:]
  assert message in lines[-1], proc.stderr[-2000:]
  assert 'Traceback' not in proc.stderr


def test_a_model_vocab_below_the_tokenizers_is_exit_2_naming_both(corpus, tmp_path):
  proc = run_cli(*text_args(corpus, '--fdl_set=model.vocab_size=256'),
                 f'--job_log_dir={tmp_path / "j"}', env=env(corpus), check=False)
  _one_line(proc, 2, 'model.vocab_size=256 is smaller than the data\'s vocab_size=500')
  assert not (tmp_path / 'j').exists()


def test_a_file_that_is_no_tokenizer_is_exit_2_naming_it(corpus, tmp_path):
  fake = tmp_path / 'tokenizer.model'
  fake.write_text('not a sentencepiece model')
  proc = run_cli(*text_args(corpus, f'--fdl_set=data.tokenizer={fake}'),
                 f'--job_log_dir={tmp_path / "j"}', env=env(corpus), check=False)
  _one_line(proc, 2, str(fake))


def test_a_glob_matching_nothing_is_exit_2(corpus, tmp_path):
  proc = run_cli(*text_args(corpus, f'--fdl_set=data.files={tmp_path}/none/*.jsonl'),
                 f'--job_log_dir={tmp_path / "j"}', env=env(corpus), check=False)
  _one_line(proc, 2, f'{tmp_path}/none/*.jsonl')


def test_decode_a_batch_of_prompts_equals_each_alone(corpus, tmp_path):
  job = tmp_path / 'job'
  args = text_args(corpus, '--fdl_set=train.num_steps=4')
  run_cli(*args, f'--job_log_dir={job}', env=env(corpus))
  prompts = ['ROMEO: What', 'Good morrow, my lord']
  (tmp_path / 'prompts.txt').write_text('\n'.join(prompts) + '\n\n')
  decode = [*args, f'--job_log_dir={job}', '--mode=decode', '--temperature=0',
            '--decode_length=12']
  batch = run_cli(*decode, f'--prompts_file={tmp_path / "prompts.txt"}', env=env(corpus)).stdout
  alone = [run_cli(*decode, f'--prompt={p}', env=env(corpus)).stdout.rstrip('\n') for p in prompts]
  assert batch.rstrip('\n') == '\n\n'.join(alone)
  assert all(text.startswith(p) and len(text) > len(p) for text, p in zip(alone, prompts))
  bad = run_cli(*decode, f'--prompts_file={tmp_path / "none.txt"}', env=env(corpus), check=False)
  assert bad.returncode == 2 and 'cannot be read' in bad.stderr.strip().splitlines()[-1]


def test_fedavg_on_the_tokenized_corpus_by_speaker(corpus, tmp_path):
  job = tmp_path / 'fed'
  run_cli('--exp=federated.TextFedAvg', '--fdl_fiddler=tiny', f'--job_log_dir={job}',
          f'--fdl_set=data.files={corpus["root"]}/*.jsonl', '--fdl_set=data.seq_len=32',
          f'--fdl_set=data.tokenizer={corpus["tokenizer"]}', '--fdl_set=data.partition=field',
          '--fdl_set=data.fields.client_field=speaker', '--fdl_set=data.batch_size=2',
          '--fdl_set=data.local_steps=2', '--fdl_set=train.num_steps=4',
          '--fdl_set=train.log_every=2', '--fdl_set=data.eval_fraction=0.05',
          '--fdl_set=data.num_eval_batches=1', env=env(corpus))
  rows = metric_rows(job)
  assert [r['step'] for r in rows] == [2, 4] and all(r['clients'] == 4 for r in rows)
  assert all(0 < r['loss'] < 10 for r in rows)


def test_dp_fedavg_on_the_tokenized_corpus_draws_poisson_cohorts_of_speakers(corpus, tmp_path):
  # The accountant's Poisson rate is the speakers' (q = clients_per_round / speakers); cohorts
  # vary in size round to round; without data.fields.client_field the run is refused before it starts.
  args = ['--exp=federated.TextDpFedAvg', '--fdl_fiddler=tiny', f'--job_log_dir={tmp_path / "dp"}',
          f'--fdl_set=data.files={corpus["root"]}/*.jsonl', '--fdl_set=data.seq_len=32',
          f'--fdl_set=data.tokenizer={corpus["tokenizer"]}', '--fdl_set=data.batch_size=2',
          '--fdl_set=data.local_steps=2', '--fdl_set=data.clients_per_round=4',
          '--fdl_set=train.num_steps=4', '--fdl_set=train.log_every=1',
          '--fdl_set=data.eval_fraction=0.05', '--fdl_set=data.num_eval_batches=1']
  refused = run_cli(*args, env=env(corpus), check=False)
  assert refused.returncode == 2 and 'needs --fdl_set=data.fields.client_field=' in refused.stderr
  assert not (tmp_path / 'dp').exists()
  run_cli(*args, '--fdl_set=data.fields.client_field=speaker', env=env(corpus))
  rows = metric_rows(tmp_path / 'dp')
  rows_in = [json.loads(line) for f in corpus['root'].glob('*.jsonl')
             for line in f.read_text().splitlines()]
  speakers = {r['speaker'] for r in rows_in  # Those with a training document (not held out).
              if int(token_build.text_hashes([r['text']], None)[0]) >= 0.05 * 2**64}
  assert [r['step'] for r in rows] == [1, 2, 3, 4]
  assert all(r['dp_poisson_rate'] == pytest.approx(4 / len(speakers)) for r in rows)
  assert len({r['clients'] for r in rows}) > 1 and all(r['clients'] < 4 * 3 for r in rows)
  epsilons = [r['dp_epsilon'] for r in rows]
  assert 0 < epsilons[0] < epsilons[-1] and epsilons == sorted(epsilons)
