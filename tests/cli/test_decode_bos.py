"""`--mode=decode` on text prompts puts the tokenizer's BOS first, as GRPO's prompt rows and
TRL do (the tokenizer's post-processor, or add_bos_token): a GRPO job's greedy decode of its
own training prompts continues the ids it trained on, BOS included."""

import fiddle as fdl
import jax
import numpy as np
import pytest
import tokenizers

from paxlike.cli import run_config
from paxlike.cli.decode_text import prompt_ids
from paxlike.config import config_io
from paxlike.decode import generate
from paxlike.tokenizers import load_tokenizer
from paxlike.trainer import restore
from tests.helpers import run_cli
from tests.tokenizers.chat_fixtures import write_chat_tokenizer

PROMPTS = ['12+3=', '7+40=', 'say hi to the us', '1+1=']


@pytest.fixture(scope='module')
def tok_json(tmp_path_factory):
  """A tokenizer whose post-processor puts <|begin_of_text|> first (as Llama 3's)."""
  return write_chat_tokenizer(tmp_path_factory.mktemp('bos_tok'), None,
                              {'eos_token': '<|im_end|>', 'pad_token': '<|endoftext|>'},
                              bos_post_processor=True)


def test_prompt_ids_are_the_tokenizers_own_encode_with_its_bos(tok_json):
  tok = load_tokenizer(str(tok_json))
  reference = tokenizers.Tokenizer.from_file(str(tok_json))
  assert tok.bos_prefix  # The case under test: a tokenizer that adds BOS.
  for prompt, ids in zip(PROMPTS, prompt_ids(tok, PROMPTS)):
    assert ids.tolist() == reference.encode(prompt).ids
    assert ids[0] == reference.token_to_id('<|begin_of_text|>')
  bytes_ = load_tokenizer('bytes')  # No BOS rule: the bytes alone.
  assert prompt_ids(bytes_, ['ab'])[0].tolist() == [97, 98]


@pytest.mark.slow
def test_decode_continues_grpos_training_prompts_with_their_bos(tok_json, tmp_path):
  from paxlike.data import arithmetic_synth
  arithmetic_synth.write_rows(tmp_path / 'sums.jsonl', arithmetic_synth.addition_rows(60))
  job = tmp_path / 'job'
  run_cli('--exp=lm.GrpoTiny', '--fdl_fiddler=tiny', f'--fdl_set=data.files={tmp_path}/sums.jsonl',
          f'--fdl_set=data.tokenizer={tok_json}', '--fdl_set=model.vocab_size=384',
          '--fdl_set=train.num_steps=1', '--fdl_set=data.batch_size=2',
          '--fdl_set=loss.num_generations=2', '--fdl_set=data.num_eval_batches=1',
          '--fdl_set=data.eval_batch_size=2', f'--job_log_dir={job}')
  task = fdl.build(config_io.with_run_lengths(run_config.run_config(str(job), None)))
  placed, _, state = restore.load_latest_state(task, job, evaluator=False)
  params = jax.device_get(restore.export_params(placed, state))
  tok = task.data.loaded_tokenizer
  rows = task.data.rows  # GRPO's own prompt ids: BOS first.
  prompts = rows.prompts[:8]
  assert all(ids[0] == tok.bos_prefix[0] for ids in rows.ids[:8])
  greedy = lambda ids: [tok.decode([t for t in row.tolist() if t != tok.eos_id]) for row in
                        generate(task.model, params, ids, max_new_tokens=4, eos_id=tok.eos_id,
                                 pad_id=tok.pad_id)]
  want, without_bos = greedy(rows.ids[:8]), greedy(tok.encode_batch(prompts))
  assert want != without_bos  # The BOS matters to this model: the check can tell.
  (tmp_path / 'prompts.txt').write_text('\n'.join(prompts) + '\n')
  out = run_cli(f'--job_log_dir={job}', '--mode=decode', '--temperature=0',
                '--decode_length=4', f'--prompts_file={tmp_path / "prompts.txt"}').stdout
  assert out == '\n\n'.join(p + w for p, w in zip(prompts, want)) + '\n'
