"""Reading a user's corpus: every format, globs, and bad input as one-line errors."""

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from paxlike.data import text_files
from paxlike.errors import RunFailure, UserError

F = text_files.Fields


class Doc:
  """One document of a block."""

  def __init__(self, text, prompt, client):
    self.text, self.prompt, self.client = text, prompt, client


def read_all(path, fields=F()):
  counts = text_files.Counts()
  docs = [Doc(t, (b.prompts or [None] * len(b.texts))[i], (b.clients or [None] * len(b.texts))[i])
          for b in text_files.read(path, fields, counts) for i, t in enumerate(b.texts)]
  return docs, counts


def write_jsonl(path, rows):
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  return path


@pytest.mark.parametrize('block_bytes', [4 << 20, 1, 7])
def test_txt_as_one_document_per_file_line_or_paragraph(tmp_path, monkeypatch, block_bytes):
  monkeypatch.setattr(text_files, 'BLOCK_BYTES', block_bytes)  # Blocks cut anywhere.
  path = tmp_path / 'a.txt'
  path.write_text('first line\nsecond\n\n  \nthird\r\nfourth\n')
  docs, _ = read_all(path, F(txt_document='file'))
  assert [d.text for d in docs] == ['first line\nsecond\n\n  \nthird\r\nfourth\n']
  docs, _ = read_all(path, F(txt_document='line'))
  assert [d.text for d in docs] == ['first line', 'second', 'third', 'fourth']
  docs, _ = read_all(path, F(txt_document='paragraph'))
  assert [d.text for d in docs] == ['first line\nsecond', 'third\nfourth']
  (tmp_path / 'empty.txt').write_text('\n\n')
  docs, counts = read_all(tmp_path / 'empty.txt')
  assert docs == [] and counts.empty == 1


def test_jsonl_and_gzip_rows_with_the_field_others_counted(tmp_path):
  rows = [{'text': 'a'}, {'body': 'no text'}, {'text': 7}, {'text': 'b', 'author': 'x'},
          {'text': ''}, {'text': 'c', 'author': 3}]
  plain = write_jsonl(tmp_path / 'r.jsonl', rows)
  with gzip.open(tmp_path / 'r.jsonl.gz', 'wt') as f:
    f.write(plain.read_text() + '\n\n')
  for path in (plain, tmp_path / 'r.jsonl.gz'):
    docs, counts = read_all(path)
    assert [d.text for d in docs] == ['a', 'b', 'c'] and (counts.missing, counts.empty) == (2, 1)
    docs, counts = read_all(path, F(client_field='author'))
    assert [(d.text, d.client) for d in docs] == [('b', 'x'), ('c', '3')]
    assert counts.missing == 4
    assert 'without text or author' in counts.summary(F(client_field='author'))


def test_sft_rows_need_prompt_and_completion(tmp_path):
  path = write_jsonl(tmp_path / 's.jsonl', [
      {'prompt': 'Q1', 'completion': 'A1'}, {'prompt': 'Q2'}, {'completion': 'A3'},
      {'prompt': '', 'completion': 'A4'}])
  docs, counts = read_all(path, F(prompt_field='prompt'))
  assert [(d.prompt, d.text) for d in docs] == [('Q1', 'A1'), ('', 'A4')]
  assert counts.missing == 2
  with pytest.raises(UserError, match=r'a\.txt: SFT data .* needs JSONL or Parquet'):
    (tmp_path / 'a.txt').write_text('x')
    read_all(tmp_path / 'a.txt', F(prompt_field='prompt'))


def test_parquet_read_in_batches_with_nulls_counted(tmp_path, monkeypatch):
  monkeypatch.setattr(text_files, 'PARQUET_BATCH_ROWS', 3)
  texts = [f'doc {i}' if i % 4 else None for i in range(10)]
  table = pa.table({'text': texts, 'author': [f'a{i % 2}' for i in range(10)],
                    'other': list(range(10))})
  pq.write_table(table, tmp_path / 'c.parquet', row_group_size=4)
  docs, counts = read_all(tmp_path / 'c.parquet', F(client_field='author'))
  assert [(d.text, d.client) for d in docs] == [(t, f'a{i % 2}') for i, t in enumerate(texts) if t]
  assert counts.missing == 3 and counts.bytes_done > 0
  with pytest.raises(UserError, match=r"c\.parquet: no column 'body'"):
    read_all(tmp_path / 'c.parquet', F(text_field='body'))


def test_invalid_utf8_is_replaced_and_counted(tmp_path):
  path = tmp_path / 'bad.txt'
  path.write_bytes(b'ok \xff\xfe line\nvalid \xef\xbf\xbd kept\n\xc3\n')
  docs, counts = read_all(path, F(txt_document='line'))
  assert [d.text for d in docs] == ['ok \ufffd\ufffd line', 'valid \ufffd kept', '\ufffd']
  assert counts.replaced == 3  # The valid U+FFFD of line 2 is no replacement.
  assert counts.summary(F()) == 'replaced 3 invalid UTF-8 sequences with U+FFFD'


def test_every_row_missing_the_field_is_a_user_error_naming_field_and_file(tmp_path):
  path = write_jsonl(tmp_path / 'x.jsonl', [{'body': 'a'}, {'body': 'b'}])
  with pytest.raises(UserError, match=r"x\.jsonl: none of its 2 rows has text") as error:
    read_all(path)
  assert '\n' not in str(error.value)


@pytest.mark.parametrize('name, data, message', [
    ('t.jsonl.gz', gzip.compress(b'{"text": "abc"}\n' * 200, mtime=0)[:-20], 'corrupt gzip data'),
    ('g.jsonl.gz', b'not gzip at all', 'corrupt gzip data'),
    ('p.parquet', b'PAR1 this is no parquet file', 'unreadable Parquet file'),
    ('j.jsonl', b'{"text": "ok"}\n{"text": broken\n', r'j\.jsonl:2: not a JSON line'),
], ids=['truncated-gzip', 'not-gzip', 'not-parquet', 'broken-json-line'])
def test_corrupt_files_are_run_failures_naming_the_file(tmp_path, name, data, message):
  (tmp_path / name).write_bytes(data)
  with pytest.raises(RunFailure, match=message) as error:
    read_all(tmp_path / name)
  assert name in str(error.value) and '\n' not in str(error.value)


def test_globs_sorted_deduplicated_named_relative_to_their_directory(tmp_path):
  for name in ('b/2.jsonl', 'a/1.txt', 'a/3.parquet', 'a/skip.csv'):
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_text('x')
  files = text_files.expand([str(tmp_path / 'a/*.txt'), str(tmp_path / '**/*.jsonl'),
                             str(tmp_path / 'a/1.txt'), str(tmp_path / 'a/*.parquet')])
  assert list(files) == ['a/1.txt', 'a/3.parquet', 'b/2.jsonl']
  assert files['b/2.jsonl'] == tmp_path / 'b/2.jsonl'
  assert list(text_files.expand(str(tmp_path / 'a/1.txt'))) == ['1.txt']
  with pytest.raises(UserError, match=r"data.files: '.*/nothing\*' matches no file"):
    text_files.expand([str(tmp_path / 'a/*.txt'), str(tmp_path / 'nothing*')])
  with pytest.raises(UserError, match=r'skip\.csv is not a \.txt, \.jsonl'):
    text_files.expand(str(tmp_path / 'a/*'))
