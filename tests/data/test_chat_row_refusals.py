"""A chat row its template refuses names its file and line (JSONL) or row (Parquet) in the one
line the build ends with (paxlike/data/token_build.py, text_files.py)."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from paxlike.data import token_store
from paxlike.data.text_data import TextData
from paxlike.data.text_files import Fields
from paxlike.errors import UserError
from tests.tokenizers.chat_fixtures import write_family

GEMMA_TPL = 'tokenizer_config.json failed on a conversation of roles [system, user, assistant]: '


@pytest.fixture(autouse=True)
def token_dir(tmp_path, monkeypatch):
  monkeypatch.setenv(token_store.TOKEN_DIR_ENV, str(tmp_path / 'tokens'))


def rows(bad_at: int) -> list:
  """12 conversations, row `bad_at` (from 0) with a system turn, which Gemma's template
  refuses; a blank line and a row without messages before it (skipped, still counted as lines)."""
  talk = lambda i: [{'role': 'user', 'content': f'what is {i} plus {i}?'},
                    {'role': 'assistant', 'content': f'{2 * i}'}]
  out = [{'messages': talk(i)} for i in range(12)]
  out[bad_at] = {'messages': [{'role': 'system', 'content': 'Be brief.'}, *talk(bad_at)]}
  return out


def data(tmp_path, files):
  return TextData(files=str(files), tokenizer=str(write_family(tmp_path / 'gemma', 'gemma')),
                  fields=Fields(messages_field='messages'), seq_len=64, batch_size=2,
                  eval_batch_size=2, eval_fraction=0.2)


def test_a_refused_jsonl_row_is_named_by_file_and_line(tmp_path):
  path = tmp_path / 'chat.jsonl'
  lines = [json.dumps(r) for r in rows(7)]
  lines[2:2] = ['', json.dumps({'text': 'no messages'})]  # The bad row is now on line 10.
  path.write_text('\n'.join(lines) + '\n')
  with pytest.raises(UserError) as error:
    _ = data(tmp_path, path).store
  assert str(error.value).startswith(f'{path}:10: chat template {tmp_path}/gemma/{GEMMA_TPL}')
  assert str(error.value).endswith("raise_exception('System role not supported')")


def test_a_refused_parquet_row_is_named_by_its_row(tmp_path):
  path = tmp_path / 'chat.parquet'
  pq.write_table(pa.Table.from_pylist(rows(4)), path)
  with pytest.raises(UserError, match=rf'^{path}: row 5: chat template '):
    _ = data(tmp_path, path).store
