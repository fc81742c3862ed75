"""`python -m paxlike.tokenizers train`: end to end in subprocesses, and its corpus reader (the
data pipeline's, paxlike/data/text_files.py)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess

import pytest

from paxlike.data import text_files
from paxlike.errors import RunFailure, UserError
from paxlike.tokenizers import __main__ as cli
from paxlike.tokenizers import load_tokenizer, train
from tests.helpers import cli_env, run_python

PREFIX = 'paxlike.tokenizers: error: '


def _cli(*args: str) -> subprocess.CompletedProcess:
  return run_python(['-m', 'paxlike.tokenizers', 'train', *args], cli_env(), timeout=120)


def _one_error_line(proc: subprocess.CompletedProcess, needle: str, code: int = 2) -> None:
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == code and len(lines) == 1, proc.stderr[-2000:]
  assert needle in lines[0], lines[0]


@pytest.mark.parametrize('kind,file', [('sentencepiece', 'tokenizer.model'),
                                       ('bpe', 'tokenizer.json')])
def test_trains_from_txt_and_jsonl_gz(kind, file, tmp_path, corpus_text):
  """Two globs (one repeated flag, one comma list) over a .txt and a .jsonl.gz with its own
  text field; the tokenizer written round-trips text neither file holds."""
  half = len(corpus_text) // 2
  (tmp_path / 'a.txt').write_text(corpus_text[:half])
  with gzip.open(tmp_path / 'b.jsonl.gz', 'wt') as f:
    for line in corpus_text[half:].split('\n\n'):
      f.write(json.dumps({'body': line, 'id': 1}) + '\n')
  out = tmp_path / 'out'
  proc = _cli(f'--files={tmp_path}/*.txt', f'--files={tmp_path}/none*.jsonl,{tmp_path}/*.gz',
              '--vocab_size=350', f'--kind={kind}', f'--out={out}', '--text_field=body')
  assert proc.returncode == 2 and "none*.jsonl' matches no file" in proc.stderr
  assert not out.exists()
  proc = _cli(f'--files={tmp_path}/*.txt', f'--files={tmp_path}/*.txt,{tmp_path}/*.gz',
              '--vocab_size=350', f'--kind={kind}', f'--out={out}', '--text_field=body')
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines() == [f'{out / file} vocab_size=350']
  expected = {file, 'tokenizer_config.json'} if kind == 'bpe' else {file}
  assert {p.name for p in out.iterdir()} == expected  # no temporary file left behind
  tok = load_tokenizer(out)
  assert (tok.path, tok.vocab_size) == (str(out / file), 350)
  text = 'Ünïcödé 中文 😀 and <|endoftext|>\n'
  assert tok.decode(tok.encode_batch([text])[0]) == text
  before = (out / file).read_bytes()
  again = _cli(f'--files={tmp_path}/a.txt', '--vocab_size=300', f'--kind={kind}', f'--out={out}')
  _one_error_line(again, 'exists; pass --overwrite')
  assert (out / file).read_bytes() == before


@pytest.mark.parametrize('args,needle', [
    (['--files=/nonexistent/*.txt', '--vocab_size=300', '--kind=bpe'], 'matches no file'),
    (['--files={c}', '--vocab_size=many', '--kind=bpe'], "invalid int value: 'many'"),
    (['--files={c}', '--vocab_size=-5', '--kind=bpe'], 'must be a positive integer'),
    (['--files={c}', '--vocab_size=300', '--kind=wordpiece'], "invalid choice: 'wordpiece'"),
    (['--files={c}', '--vocab_size=100000', '--kind=sentencepiece'], 'lower --vocab_size'),
    (['--files={c}', '--vocab_size=100000', '--kind=bpe'], 'lower --vocab_size'),
    (['--files={e}', '--vocab_size=300', '--kind=sentencepiece'], 'no text to train on'),
    (['--vocab_size=300', '--kind=bpe'], 'required: --files'),
])
def test_bad_input_exits_2_with_one_line(args, needle, tmp_path, corpus_file):
  (tmp_path / 'empty.txt').write_text(' \n\n')
  args = [a.format(c=corpus_file, e=tmp_path / 'empty.txt') for a in args]
  proc = _cli(*args, f'--out={tmp_path / "out"}')
  _one_error_line(proc, PREFIX)
  _one_error_line(proc, needle)
  assert not (tmp_path / 'out').exists()


def _texts(*paths, text_field='text'):
  fields, counts = text_files.Fields(text_field=text_field), text_files.Counts()
  return list(cli.documents(paths, fields, counts)), counts


def test_reader_skips_and_counts_bad_rows_and_names_bad_files(tmp_path):
  """The CLI reads as TextData does: rows without the field are skipped and counted (a file
  with none is exit 2 naming --text_field), invalid UTF-8 replaced and counted, corrupt files
  a RunFailure naming the file (and line), Parquet read by its column."""
  good = tmp_path / 'good.jsonl'
  good.write_text('{"text": "a"}\n\n{"body": "x"}\n{"text": "b", "x": 1}\n')
  (tmp_path / 'latin1.txt').write_bytes('café'.encode('latin-1'))
  texts, counts = _texts(good, tmp_path / 'latin1.txt')
  assert texts == ['a', 'b', 'caf\ufffd'] and (counts.missing, counts.replaced) == (1, 1)
  cases = {'missing.jsonl': (b'{"body": "a"}\n{"body": "b"}\n', UserError,
                             r'missing\.jsonl: none of its 2 rows has text \(set --text_field\)'),
           'bad.jsonl': (b'{"text": "a"}\n{oops\n', RunFailure, r'bad\.jsonl:2: not a JSON line'),
           'broken.jsonl.gz': (b'not gzip', RunFailure, r'broken\.jsonl\.gz: corrupt gzip')}
  for name, (content, error, needle) in cases.items():
    (tmp_path / name).write_bytes(content)
    with pytest.raises(error, match=needle):
      _texts(tmp_path / name)
  import pyarrow as pa
  import pyarrow.parquet as pq
  pq.write_table(pa.table({'body': ['p', 'q']}), tmp_path / 'data.parquet')
  assert _texts(tmp_path / 'data.parquet', text_field='body')[0] == ['p', 'q']
  (tmp_path / 'data.csv').write_text('x')
  with pytest.raises(UserError, match=r'--files: .*data\.csv is not a \.txt'):
    text_files.expand([str(tmp_path / '*.csv')], option='--files')


def test_cli_notes_what_it_skipped(tmp_path, corpus_text):
  rows = [{'text': line} for line in corpus_text.split('\n\n')] + [{'body': 'no text'}] * 3
  (tmp_path / 'c.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  proc = _cli(f'--files={tmp_path}/c.jsonl', '--vocab_size=300', '--kind=bpe',
              f'--out={tmp_path / "out"}')
  assert proc.returncode == 0, proc.stderr
  assert 'paxlike.tokenizers: note: skipped 3 rows without text' in proc.stderr
  assert load_tokenizer(tmp_path / 'out').vocab_size == 300


def test_a_reading_error_inside_sentencepiece_comes_out_as_itself(tmp_path, corpus_text):
  """SentencePiece wraps its iterator's exceptions; the reader's UserError is re-raised."""
  (tmp_path / 'a.txt').write_text(corpus_text)
  (tmp_path / 'b.jsonl').write_text('{"body": 1}\n')
  texts = cli.documents([tmp_path / 'a.txt', tmp_path / 'b.jsonl'], text_files.Fields(),
                        text_files.Counts())
  with pytest.raises(UserError, match=r"b\.jsonl: none of its 1 rows has text"):
    train.sentencepiece_model(texts, 300)


def test_a_tokenizer_write_cut_short_leaves_the_old_files(tmp_path, monkeypatch, corpus_text):
  out = tmp_path / 'tok'
  train.write_tokenizer('bpe', [corpus_text], 300, out)
  before = {p.name: p.read_bytes() for p in out.iterdir()}

  def killed(src, dst):
    raise KeyboardInterrupt  # as if the run stopped between writing and renaming

  monkeypatch.setattr(os, 'replace', killed)
  with pytest.raises(KeyboardInterrupt):
    train.write_tokenizer('bpe', [corpus_text.upper()], 300, out)
  assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # No temporary left.
  monkeypatch.undo()
  train.write_tokenizer('bpe', [corpus_text.upper()], 300, out)
  assert (out / 'tokenizer.json').read_bytes() != before['tokenizer.json']
