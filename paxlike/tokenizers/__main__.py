"""Trains a tokenizer on local text files.

  python -m paxlike.tokenizers train --files='corpus/*.txt,more/*.jsonl.gz' --vocab_size=8000 \
      --kind=sentencepiece|bpe --out=DIR [--text_field=text] [--overwrite]
  paxlike tokenizers train ...    (the same program)

Writes DIR/tokenizer.model (SentencePiece BPE: pad 0, unk 1, bos 2, eos 3, byte fallback, text
kept exactly) or DIR/tokenizer.json + DIR/tokenizer_config.json (Hugging Face byte-level BPE:
pad 0 '<pad>', eos 1 '<|endoftext|>'), then prints the path and the vocab size. The files are
read as TextData reads them (paxlike/data/text_files.py): `.txt` whole, `.jsonl`/`.jsonl.gz`/
`.parquet` by --text_field; rows without it are skipped and invalid UTF-8 replaced, each
counted in a note on stderr (a file where no row has the field exits 2). A corpus too small for
--vocab_size exits 2 saying how large it may be (no silently smaller vocab). Exit codes as
`paxlike train`: 2 for a usage error, 1 for unreadable data, each one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from paxlike.data import text_files
from paxlike.errors import RunFailure, UserError
from paxlike.tokenizers import load_tokenizer, train

PROG = 'paxlike.tokenizers'


class _Parser(argparse.ArgumentParser):
  """argparse whose usage errors are UserErrors (one line, exit 2), as paxlike's absl flags."""

  def error(self, message: str):
    raise UserError(message)


def _parser() -> argparse.ArgumentParser:
  parser = _Parser(prog=PROG, description='Tokenizers for paxlike.')
  commands = parser.add_subparsers(dest='command', required=True, parser_class=_Parser)
  cmd = commands.add_parser('train', help='Train a tokenizer on local text files.')
  cmd.add_argument('--files', action='append', required=True,
                   help='Glob of .txt/.jsonl/.jsonl.gz/.parquet files; repeatable or comma '
                   'separated.')
  cmd.add_argument('--vocab_size', type=int, required=True, help='Ids in the tokenizer.')
  cmd.add_argument('--kind', required=True, choices=sorted(train.FILE_NAMES),
                   help='sentencepiece: tokenizer.model; bpe: HF tokenizer.json.')
  cmd.add_argument('--out', required=True, help='Directory to write the tokenizer into.')
  cmd.add_argument('--text_field', default='text',
                   help='The text field of JSONL records and Parquet rows.')
  cmd.add_argument('--overwrite', action='store_true', help='Replace a tokenizer in --out.')
  return parser


def train_command(args: argparse.Namespace) -> str:
  """Trains and writes the tokenizer; the line to print."""
  if args.vocab_size < 1:
    raise UserError(f'--vocab_size={args.vocab_size} must be a positive integer')
  out = Path(args.out).expanduser()
  target = out / train.FILE_NAMES[args.kind]
  if out.exists() and not out.is_dir():
    raise UserError(f'--out={out}: is a file, not a directory')
  if target.exists() and not args.overwrite:
    raise UserError(f'{target} exists; pass --overwrite to replace it or choose another --out')
  patterns = [p.strip() for arg in args.files for p in arg.split(',') if p.strip()]
  if not patterns:
    raise UserError('--files is required (a glob of .txt, .jsonl, .jsonl.gz or .parquet files)')
  files = text_files.expand(patterns, option='--files')
  fields, counts = text_files.Fields(text_field=args.text_field), text_files.Counts()
  path = train.write_tokenizer(args.kind, documents(files.values(), fields, counts),
                               args.vocab_size, out)
  if summary := counts.summary(fields):
    print(f'{PROG}: note: {summary}', file=sys.stderr)
  return f'{path} vocab_size={load_tokenizer(path).vocab_size}'


def documents(files: Sequence[Path], fields: text_files.Fields,
              counts: text_files.Counts) -> Iterator[str]:
  """The texts of `files` read with `fields` (text_files.read, errors naming --text_field)."""
  for path in files:
    for block in text_files.read(path, fields, counts, options='--'):
      yield from block.texts


def main(argv: list[str] | None = None) -> int:
  """The CLI; its exit code (a UserError 2, a RunFailure 1, each one line on stderr)."""
  try:
    print(train_command(_parser().parse_args(argv)))
  except UserError as error:
    print(f'{PROG}: error: {error}', file=sys.stderr)
    return 2
  except RunFailure as error:
    print(f'{PROG}: failed: {error}', file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
