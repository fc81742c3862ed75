"""PromptData (GRPO's prompts): rows without a prompt and prompts past seq_len are counted and
left out; a step's prompts are a pure function of (seed, step) and an epoch visits every
training row once; held-out rows never train; eval batches score the answer and its EOS."""

import json

import numpy as np
import pytest

from paxlike.data import arithmetic_synth
from paxlike.data.prompt_data import PromptData
from paxlike.errors import UserError


@pytest.fixture(scope='module')
def data(tmp_path_factory):
  rows = arithmetic_synth.addition_rows(40, seed=1)
  rows += [{'answer': '3'}, {'prompt': ''}, {'prompt': '1234567890+1=', 'answer': '1234567891'}]
  path = tmp_path_factory.mktemp('prompts') / 'rows.jsonl'
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  return PromptData(files=str(path), seq_len=8, batch_size=4, eval_fraction=0.1,
                    eval_batch_size=4, num_eval_batches=None)


def test_rows_without_a_prompt_or_too_long_are_counted_and_left_out(data):
  assert (data.rows.skipped, data.rows.too_long, len(data.rows.ids)) == (2, 1, 40)
  train, held = data.split
  assert (len(train), len(held)) == (36, 4) and not set(train) & set(held)
  assert '36 train, 4 held out; 2 skipped (no prompt), 1 longer than' in data.config_lines()


def test_a_steps_prompts_are_a_function_of_seed_and_step_and_an_epoch_sees_every_row(data):
  first, _ = data.round_batches(seed=3, step=2)
  again, _ = data.round_batches(seed=3, step=2)
  for key in first:
    np.testing.assert_array_equal(first[key], again[key])
  assert first['inputs'].shape == (1, 1, 4, 8) and first['row'].shape == (1, 1, 4)
  for i, row in enumerate(first['row'][0, 0].tolist()):
    n = first['lengths'][0, 0, i]
    assert data.loaded_tokenizer.decode(first['inputs'][0, 0, i, :n].tolist()) == (
        data.rows.prompts[row])
    assert first['mask'][0, 0, i].sum() == n
  epoch = np.concatenate([data.round_batches(3, s)[0]['row'].ravel() for s in range(9)])
  assert sorted(epoch.tolist()) == sorted(data.split[0].tolist())
  other = data.round_batches(seed=4, step=2)[0]['row']
  assert not np.array_equal(other, first['row'])
  half = data.round_batches(seed=3, step=2, rows=slice(2, 4))[0]['row']
  np.testing.assert_array_equal(half, first['row'][:, :, 2:4])


def test_eval_batches_score_the_answer_and_its_eos(data):
  [batch] = data.eval_batches()
  tokenizer = data.loaded_tokenizer
  for i, row in enumerate(data.split[1].tolist()):
    scored = batch['targets'][i][batch['mask'][i] > 0]
    assert tokenizer.decode(scored.tolist()) == data.rows.answers[row] + '\n'
    prompt = data.rows.prompts[row]
    assert tokenizer.decode(batch['inputs'][i, :len(prompt)].tolist()) == prompt


def test_bad_settings_are_one_line_errors(tmp_path):
  (tmp_path / 'x.jsonl').write_text(json.dumps({'prompt': 'a long prompt'}) + '\n')
  with pytest.raises(UserError, match='no prompt row of 1 in data.files'):
    _ = PromptData(files=str(tmp_path / 'x.jsonl'), seq_len=4).rows
  with pytest.raises(UserError, match='clients_per_round and data.local_steps must be 1'):
    PromptData(files='x', local_steps=2)
  with pytest.raises(UserError, match='set one of prompt_field'):
    PromptData(files='x', prompt_field=None)


def test_chat_prompts_are_rendered_with_the_generation_prompt_and_stop_at_end_of_turn(tmp_path):
  from paxlike.tokenizers.chat_encoder import load_chat_encoder
  from tests.tokenizers.chat_fixtures import reference_ids, write_family
  tokenizer = write_family(tmp_path / 'tok', 'gemma')
  rows = [{'messages': [{'role': 'user', 'content': f'{i}+1='}], 'answer': str(i + 1)}
          for i in range(10)]
  (tmp_path / 'chat.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  data = PromptData(files=str(tmp_path / 'chat.jsonl'), tokenizer=str(tokenizer), seq_len=64,
                    prompt_field=None, messages_field='messages', eval_fraction=0.2)
  encoder = load_chat_encoder(data.loaded_tokenizer)
  text = encoder.template.render(rows[3]['messages'], add_generation_prompt=True)
  assert data.rows.prompts[3] == text and text.endswith('<start_of_turn>model\n')
  assert data.rows.ids[3].tolist() == reference_ids(tokenizer, text)
  assert data.stop_id() == encoder.end_of_turn_id != encoder.eos_id
