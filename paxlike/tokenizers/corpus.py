"""The text a tokenizer is trained on: local files given by globs, read as documents."""

from __future__ import annotations

import glob
import gzip
import json
import os
import zlib
from pathlib import Path
from typing import Iterator, Sequence

from paxlike.errors import RunFailure, UserError

SUFFIXES = ('.txt', '.jsonl', '.jsonl.gz')


def expand_globs(patterns: Sequence[str]) -> list[Path]:
  """The files the globs match (each argument may hold several, comma separated; `**` recurses),
  in order, each once. A glob matching no file, or a file of another type, is a UserError."""
  files: list[Path] = []
  for pattern in (p.strip() for arg in patterns for p in arg.split(',')):
    if not pattern:
      continue
    matches = sorted(m for m in glob.glob(os.path.expanduser(pattern), recursive=True)
                     if os.path.isfile(m))
    if not matches:
      raise UserError(f'--files={pattern}: matches no file')
    files.extend(Path(m) for m in matches)
  if not files:
    raise UserError('--files is required (a glob of .txt, .jsonl or .jsonl.gz files)')
  for file in files:
    if not file.name.endswith(SUFFIXES):
      raise UserError(f'{file}: not a text file paxlike reads (expected {", ".join(SUFFIXES)})')
  return list(dict.fromkeys(files))


def documents(files: Sequence[Path], text_field: str = 'text') -> Iterator[str]:
  """Each `.txt` file whole, and the `text_field` of each line of the JSONL files. A record
  without that field is a UserError; bytes that are not UTF-8, JSON or gzip a RunFailure."""
  for file in files:
    try:
      if file.name.endswith('.txt'):
        yield file.read_text('utf-8')
      else:
        yield from _jsonl_texts(file, text_field)
    except UnicodeDecodeError as error:
      raise RunFailure(f'{file}: not UTF-8 text (byte {error.start} of a read)') from None
    except (OSError, EOFError, zlib.error) as error:
      raise RunFailure(f'{file}: cannot read it ({error})') from None


def _jsonl_texts(file: Path, text_field: str) -> Iterator[str]:
  opener = gzip.open if file.name.endswith('.gz') else open
  with opener(file, 'rt', encoding='utf-8') as lines:
    for number, line in enumerate(lines, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError:
        raise RunFailure(f'{file}:{number}: not a JSON line') from None
      text = record.get(text_field) if isinstance(record, dict) else None
      if not isinstance(text, str):
        raise UserError(f'{file}:{number}: no string field {text_field!r} '
                        '(choose the field with --text_field)')
      yield text
