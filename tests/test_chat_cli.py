"""`lm.ChatSftLlama` through the CLI: an HF-layout checkpoint with a ChatML tokenizer and template,
JSONL rows of messages; the loss on the assistant's replies only, `--mode=decode --chat`, and a
template that does not compile as one line, exit 2."""

import json
import re

import numpy as np
import pytest

from paxlike.layers import TransformerLM
from tests.hf_fixtures import write_random_checkpoint
from tests.helpers import cli_env, metric_rows, run_cli, run_python
from tests.tokenizers.chat_fixtures import FAMILIES, write_chat_tokenizer, write_family

pytestmark = pytest.mark.slow

MODEL = dict(vocab_size=384, num_layers=1, d_model=32, num_heads=2, num_kv_heads=1, d_ff=64,
             max_len=128, tied_embeddings=False, norm_eps=1e-5)
REPLY = re.compile(r'<\|im_start\|>assistant\n(.*?)<\|im_end\|>', re.DOTALL)


def write_source(root):
  """An HF dir (random weights, config.json, a ChatML tokenizer and template) and chat rows."""
  write_random_checkpoint(TransformerLM(**MODEL), root / 'hf')
  write_family(root / 'hf', 'chatml')
  with open(root / 'chat.jsonl', 'w') as f:
    for i in range(60):
      talk = [{'role': 'user', 'content': f'what is {i} plus {i}?'},
              {'role': 'assistant', 'content': f'The answer is {2 * i}.'}]
      f.write(json.dumps({'messages': talk}) + '\n')
  return root


def chat_args(root, job, steps=2):
  return ['--exp=lm.ChatSftLlama', f'--job_log_dir={job}',
          f'--fdl_set=train.init_from=hf:{root}/hf', f'--fdl_set=data.files={root}/chat.jsonl',
          '--fdl_set=data.seq_len=64', '--fdl_set=data.batch_size=4',
          '--fdl_set=data.eval_batch_size=4', '--fdl_set=data.eval_fraction=0.1',
          '--fdl_set=data.num_eval_batches=1', f'--fdl_set=train.num_steps={steps}',
          '--fdl_set=train.log_every=2', '--fdl_set=train.checkpoint_every=2',
          '--fdl_set=train.eval_every=2']


def test_chat_sft_trains_on_replies_and_decodes_a_chat_turn(tmp_path):
  from paxlike import registry
  from paxlike.config import config_io
  root, job = write_source(tmp_path), tmp_path / 'job'
  env = cli_env(PAXLIKE_TOKEN_DIR=str(tmp_path / 'tokens'))
  run_cli(*chat_args(root, job), env=env)
  rows = metric_rows(job)
  assert [r['step'] for r in rows] == [2] and np.isfinite(rows[-1]['loss'])
  registry.import_all()  # The run's own data config: its batches' targets are the replies.
  data = config_io.build(config_io.load_file(job / 'config.json')).data
  batch, _ = data.round_batches(0, 0)
  tokenizer = data.loaded_tokenizer
  for row in range(batch['inputs'].shape[-2]):
    inputs, targets = batch['inputs'][0, 0, row], batch['targets'][0, 0, row]
    mask, seg = batch['mask'][0, 0, row], batch['segment_ids'][0, 0, row]
    for s in set(seg[seg > 0].tolist()):
      text = tokenizer.decode(inputs[seg == s].tolist())
      trained = tokenizer.decode(targets[(seg == s) & (mask > 0)].tolist())
      assert trained == ''.join(r + '<|im_end|>' for r in REPLY.findall(text + '<|im_end|>'))
      assert trained.startswith('The answer is ')
  decoded = run_cli(*chat_args(root, job), '--mode=decode', '--chat',
                    '--prompt=what is 3 plus 3?', '--decode_length=6', '--temperature=0',
                    env=env)
  assert decoded.stdout.startswith('user: what is 3 plus 3?\nassistant: '), decoded.stdout
  assert '<|im_end|>' not in decoded.stdout
  assert 'ignores add_generation_prompt' not in decoded.stderr  # ChatML's has the prompt.
  # The export says where generate stops: the source has no generation_config.json, so the
  # tokenizer's eos (<|im_end|>, its end of turn) and pad.
  out = tmp_path / 'exported'
  exported = run_python(['-m', 'paxlike.interop.hf', f'--job_log_dir={job}', f'--out={out}'],
                        env, timeout=300)
  assert exported.returncode == 0, exported.stderr[-2000:]
  assert 'generation_config.json' in exported.stdout + exported.stderr
  assert json.loads((out / 'generation_config.json').read_text()) == {
      'eos_token_id': tokenizer._tok.token_to_id('<|im_end|>'),
      'pad_token_id': tokenizer._tok.token_to_id('<|endoftext|>')}


def test_decode_chat_notes_a_template_that_ignores_add_generation_prompt(tmp_path):
  root, job = write_source(tmp_path), tmp_path / 'job'
  write_family(root / 'hf', 'mistral')  # [INST] ... [/INST]: no assistant header to add.
  env = cli_env(PAXLIKE_TOKEN_DIR=str(tmp_path / 'tokens'))
  run_cli(*chat_args(root, job), env=env)
  decoded = run_cli(*chat_args(root, job), '--mode=decode', '--chat', '--prompt=hi',
                    '--decode_length=2', '--temperature=0', env=env)
  assert decoded.stdout.startswith('user: hi\nassistant: '), decoded.stdout
  notes = [line for line in decoded.stderr.splitlines() if line.startswith('note: chat template')]
  assert len(notes) == 1 and notes[0].endswith(
      f"{job}/source/tokenizer_config.json ignores add_generation_prompt (a user turn renders the "
      "same with and without it), so each reply is sampled right after the user's turn with no "
      "assistant header: right for templates whose user turn ends the prompt (Mistral's "
      "[/INST]); with others the model may go on with the user's turn"), decoded.stderr


def test_a_chat_template_that_does_not_compile_is_one_line_exit_2(tmp_path):
  root = write_source(tmp_path)
  write_chat_tokenizer(root / 'hf', '{% for m in messages %}{{ m.content }',
                       FAMILIES['chatml'][1])
  proc = run_cli(*chat_args(root, tmp_path / 'job'), check=False,
                 env=cli_env(PAXLIKE_TOKEN_DIR=str(tmp_path / 'tokens')))
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert re.fullmatch(r"paxlike: error: chat template \S+/tokenizer_config\.json: line 1: "
                      r"unexpected '}'", proc.stderr.strip().splitlines()[-1]), proc.stderr
