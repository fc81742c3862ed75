"""TextData on chat rows (`data.fields.messages_field`): conversations rendered with the tokenizer's chat
template, the loss on the assistant's replies only; bad rows counted, bad settings refused."""

import concurrent.futures
import json
import re

import numpy as np
import pytest

from paxlike.data import token_store
from paxlike.data.text_data import TextData
from paxlike.data.text_files import Fields
from paxlike.errors import UserError
from tests.tokenizers.chat_fixtures import CHATML_GENERATION, FAMILIES, write_chat_tokenizer
from tests.tokenizers.chat_fixtures import write_family

REPLY = re.compile(r'<\|im_start\|>assistant\n(.*?)<\|im_end\|>', re.DOTALL)


@pytest.fixture(autouse=True)
def token_dir(tmp_path, monkeypatch):
  monkeypatch.setenv(token_store.TOKEN_DIR_ENV, str(tmp_path / 'tokens'))


def conversation(i: int) -> list[dict]:
  talk = [{'role': 'user', 'content': f'what is {i} plus {i}?'},
          {'role': 'assistant', 'content': f'The answer is {2 * i}.'}]
  if i % 3 == 0:
    talk = [{'role': 'system', 'content': 'Be brief.'}] + talk
  if i % 2 == 0:
    talk += [{'role': 'user', 'content': 'and plus 7?'},
             {'role': 'assistant', 'content': f'{2 * i + 7}'}]
  return talk


def write_rows(path, rows):
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  return str(path)


def chat_data(tmp_path, tokenizer, files=None, **overrides):
  files = files or write_rows(tmp_path / 'chat.jsonl',
                              [{'messages': conversation(i)} for i in range(40)])
  settings = dict(files=files, tokenizer=str(tokenizer), fields=Fields(messages_field='messages'), seq_len=128,
                  batch_size=4, eval_batch_size=4, eval_fraction=0.2)
  return TextData(**{**settings, **overrides})


def every_row(data, plan):
  return data._batch(plan, np.arange(plan.num_rows))


@pytest.fixture
def chatml(tmp_path):
  return write_family(tmp_path / 'chatml', 'chatml')


def test_only_the_assistant_replies_and_their_end_of_turn_are_targets(tmp_path, chatml):
  data = chat_data(tmp_path, chatml)
  tokenizer = data.loaded_tokenizer
  conversations = 0
  for plan in (data.packed.train, data.packed.eval):
    batch = every_row(data, plan)
    for row in range(plan.num_rows):
      seg = batch['segment_ids'][row]
      for s in set(seg[seg > 0].tolist()):
        at = np.flatnonzero(seg == s)
        ids = batch['inputs'][row, at]
        if at[-1] == len(seg) - 1 and batch['targets'][row, -1] != tokenizer.pad_id:
          ids = np.append(ids, batch['targets'][row, -1])  # The row's last token is its.
        text = tokenizer.decode(ids.tolist())  # The whole conversation: one row holds it.
        assert text.startswith('<|im_start|>system\n') and text.endswith('<|im_end|>\n')
        want = ''.join(reply + '<|im_end|>' for reply in REPLY.findall(text))
        trained = batch['targets'][row, at][batch['mask'][row, at] > 0]
        assert tokenizer.decode(trained.tolist()) == want
        conversations += 1
  assert conversations == 40
  assert data.store.manifest['num_docs'] == 40


def test_bad_rows_are_counted_and_a_file_of_none_is_refused(tmp_path, chatml):
  rows = [{'messages': conversation(i)} for i in range(6)] + [
      {'messages': [{'role': 'user', 'content': 'hi'}]},  # No reply: nothing to train on.
      {'messages': [{'role': 'user', 'content': 3}]},  # Not a conversation.
      {'messages': []}, {'text': 'no messages'}]
  data = chat_data(tmp_path, chatml, write_rows(tmp_path / 'mixed.jsonl', rows),
                   eval_fraction=0.5)
  assert data.store.manifest['num_docs'] == 6
  assert data.store.manifest['counts'] == {'missing': 3, 'empty': 1, 'replaced': 0}
  none = write_rows(tmp_path / 'none.jsonl', [{'text': 'a'}, {'text': 'b'}])
  with pytest.raises(UserError, match=r'none of its 2 rows has messages \(set data.fields.messages_field'):
    _ = chat_data(tmp_path, chatml, none).store


def test_settings_that_do_not_fit_chat_rows_are_refused(tmp_path, chatml):
  with pytest.raises(UserError, match='prompt_field and messages_field are two formats'):
    chat_data(tmp_path, chatml, fields=Fields(prompt_field='prompt', messages_field='messages'))
  (tmp_path / 'a.txt').write_text('text\n')
  with pytest.raises(UserError, match=r'chat data \(data.fields.messages_field=.messages.\) needs JSONL'):
    _ = chat_data(tmp_path, chatml, str(tmp_path / 'a.txt')).store
  with pytest.raises(UserError, match='need a Hugging Face tokenizer.json'):
    _ = chat_data(tmp_path, 'bytes').store


def test_a_template_that_refuses_a_conversation_stops_the_build_naming_it(tmp_path):
  gemma = write_family(tmp_path / 'gemma', 'gemma')  # conversation(0) has a system turn.
  with pytest.raises(UserError) as error:
    _ = chat_data(tmp_path, gemma).store
  assert str(error.value).startswith(  # The row is named: line 1 of chat.jsonl.
      f'{tmp_path / "chat.jsonl"}:1: chat template {tmp_path / "gemma/tokenizer_config.json"} '
      'failed on a conversation of roles [system, user, ')
  assert "raise_exception('System role not supported')" in str(error.value)


def test_parquet_rows_give_the_store_jsonl_rows_give(tmp_path, chatml):
  import pyarrow as pa
  import pyarrow.parquet as pq
  talks = [conversation(i) for i in range(40)]
  pq.write_table(pa.table({'messages': talks}), tmp_path / 'chat.parquet')
  from_parquet = chat_data(tmp_path, chatml, str(tmp_path / 'chat.parquet')).store
  from_jsonl = chat_data(tmp_path, chatml).store
  assert from_parquet.path != from_jsonl.path  # Other files, another store...
  for name in ('shards', 'trained'):  # ...with the same tokens and mask.
    got, want = getattr(from_parquet, name), getattr(from_jsonl, name)
    np.testing.assert_array_equal(np.concatenate(got) if name == 'shards' else got,
                                  np.concatenate(want) if name == 'shards' else want)


def test_another_template_is_another_store_and_plain_stores_have_no_mask(tmp_path, chatml):
  first = chat_data(tmp_path, chatml).store
  write_chat_tokenizer(chatml.parent, CHATML_GENERATION, FAMILIES['chatml'][1])
  second = chat_data(tmp_path, chatml).store
  assert first.path != second.path and second.trained is not None
  plain = TextData(files=write_rows(tmp_path / 't.jsonl', [{'text': f'doc {i}'} for i in range(20)]),
                   tokenizer=str(chatml), seq_len=16, eval_fraction=0.2).store
  assert plain.trained is None and not (plain.path / token_store.TRAINED).exists()


def test_spawned_encoders_build_the_store_one_encoder_builds(tmp_path, chatml, monkeypatch):
  """Above 16 MB and 3 workers the build encodes in spawned processes: the chat encoder (its
  tokenizer and template) pickles into them and gives the same tokens and mask."""
  from paxlike.data import text_files
  from paxlike.data import token_build
  files = write_rows(tmp_path / 'chat.jsonl', [{'messages': conversation(i)} for i in range(90)])
  monkeypatch.setattr(token_build, 'CHUNK_DOCS', 30)
  monkeypatch.setattr(text_files, 'BLOCK_ROWS', 30)
  alone = chat_data(tmp_path, chatml, files, num_workers=1).store
  (tmp_path / 'tokens').rename(tmp_path / 'alone')
  monkeypatch.setattr(token_build, 'POOL_MIN_BYTES', 0)
  monkeypatch.setattr(token_build, 'PROCESS_MIN_WORKERS', 2)
  pools = []

  class Recorded(concurrent.futures.ProcessPoolExecutor):
    def __init__(self, *args, **kwargs):
      pools.append(self)
      super().__init__(*args, **kwargs)

  monkeypatch.setattr(concurrent.futures, 'ProcessPoolExecutor', Recorded)
  pooled = chat_data(tmp_path, chatml, files, num_workers=2).store
  assert len(pools) == 1 and pooled.num_docs == 90
  assert (pooled.path / 'tokens-00000.bin').read_bytes() == (
      tmp_path / 'alone' / alone.path.name / 'tokens-00000.bin').read_bytes()
  assert (pooled.path / token_store.TRAINED).read_bytes() == (
      tmp_path / 'alone' / alone.path.name / token_store.TRAINED).read_bytes()
