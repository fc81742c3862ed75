"""`python -m paxlike.tokenizers train`: end to end in subprocesses, and its corpus reader."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

from paxlike.errors import RunFailure, UserError
from paxlike.tokenizers import corpus, load_tokenizer, train
from tests.tokenizers.conftest import REPO

PREFIX = 'paxlike.tokenizers: error: '


def _cli(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-m', 'paxlike.tokenizers', 'train', *args], cwd=REPO,
                        text=True, capture_output=True, timeout=120,
                        env={**os.environ, 'PYTHONPATH': str(REPO)})


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
  assert proc.returncode == 2 and 'none*.jsonl: matches no file' in proc.stderr
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


def test_reader_errors_name_the_file_and_line(tmp_path):
  good = tmp_path / 'good.jsonl'
  good.write_text('{"text": "a"}\n\n{"text": "b", "x": 1}\n')
  assert list(corpus.documents(corpus.expand_globs([str(good)]))) == ['a', 'b']
  cases = {'missing.jsonl': (b'{"text": "a"}\n{"body": "b"}\n', UserError, 'missing.jsonl:2'),
           'bad.jsonl': (b'{"text": "a"}\n{oops\n', RunFailure, 'bad.jsonl:2'),
           'latin1.txt': ('café'.encode('latin-1'), RunFailure, 'not UTF-8'),
           'broken.jsonl.gz': (b'not gzip', RunFailure, 'broken.jsonl.gz')}
  for name, (content, error, needle) in cases.items():
    (tmp_path / name).write_bytes(content)
    with pytest.raises(error, match=needle):
      list(corpus.documents([tmp_path / name]))
  (tmp_path / 'data.parquet').write_bytes(b'PAR1')
  with pytest.raises(UserError, match='data.parquet: not a text file'):
    corpus.expand_globs([str(tmp_path / '*.parquet')])


def test_a_reading_error_inside_sentencepiece_comes_out_as_itself(tmp_path, corpus_text):
  """SentencePiece wraps its iterator's exceptions; the reader's UserError is re-raised."""
  (tmp_path / 'a.txt').write_text(corpus_text)
  (tmp_path / 'b.jsonl').write_text('{"body": 1}\n')
  texts = corpus.documents([tmp_path / 'a.txt', tmp_path / 'b.jsonl'])
  with pytest.raises(UserError, match=r"b.jsonl:1: no string field 'text'"):
    train.sentencepiece_model(texts, 300)


def test_write_atomic_leaves_the_old_file_or_the_new_one(tmp_path, monkeypatch):
  path = tmp_path / 'tokenizer.model'
  train.write_atomic(path, b'old')

  def killed(src, dst):
    raise KeyboardInterrupt  # as if the run stopped between writing and renaming

  monkeypatch.setattr(os, 'replace', killed)
  with pytest.raises(KeyboardInterrupt):
    train.write_atomic(path, b'new')
  assert [p.name for p in tmp_path.iterdir()] == ['tokenizer.model']
  assert path.read_bytes() == b'old'
  monkeypatch.undo()
  train.write_atomic(path, b'new')
  assert path.read_bytes() == b'new'
