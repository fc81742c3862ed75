"""A user's corpus: globs of `.txt`, `.jsonl`, `.jsonl.gz` and `.parquet` files read as documents.

Rows without the field are counted and skipped (a file where every row lacks it is a
UserError); bytes that are not UTF-8 are replaced by U+FFFD and counted; a truncated `.gz`, a
line that is not JSON, or an unreadable Parquet file is corrupt data (RunFailure naming the
file). Files are read as streams of blocks of documents (text in blocks of BLOCK_BYTES cut at a
newline, Parquet in record batches), so memory does not grow with them, and the per-document
work in Python stays small (a block is decoded and split in one call).
"""

import dataclasses
import glob
import gzip
import json
import os
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from paxlike.data import chat_rows
from paxlike.errors import RunFailure, UserError

SUFFIXES = ('.txt', '.jsonl', '.jsonl.gz', '.parquet')
TXT_DOCUMENTS = ('file', 'line', 'paragraph')
PARQUET_BATCH_ROWS = 1024
BLOCK_BYTES = 4 << 20
BLOCK_ROWS = 1024


@dataclasses.dataclass(frozen=True)
class Fields:
  """How files become documents: the JSONL/Parquet `text_field`; a `.txt` file is one document
  per file, per line or per paragraph (blank-line separated); with `prompt_field` set, a row is
  an SFT example of `prompt_field` + `completion_field`; with `messages_field` set, a row is a
  conversation (chat_rows.py); `client_field` names each row's client."""

  text_field: str = 'text'
  txt_document: str = 'file'
  prompt_field: str | None = None
  completion_field: str = 'completion'
  client_field: str | None = None
  messages_field: str | None = None

  def __post_init__(self):
    for name in ('text_field', 'completion_field'):
      if not isinstance(getattr(self, name), str) or not getattr(self, name):
        raise UserError(f'fields.{name} must be a non-empty string, got {getattr(self, name)!r}')
    for name in ('prompt_field', 'client_field', 'messages_field'):
      value = getattr(self, name)
      if value is not None and not (isinstance(value, str) and value):
        raise UserError(f'fields.{name} must be None or a field name, got {value!r}')
    if self.txt_document not in TXT_DOCUMENTS:
      raise UserError(f'fields.txt_document must be one of {", ".join(TXT_DOCUMENTS)}; got '
                      f'{self.txt_document!r}')
    if self.prompt_field is not None and self.messages_field is not None:
      raise UserError('fields: prompt_field and messages_field are two formats of SFT rows; '
                      f'set one (got {self.prompt_field!r} and {self.messages_field!r})')

  def needed(self) -> list[str]:
    """The row fields a document needs."""
    return [getattr(self, name) for name in self.needed_names()]

  def needed_names(self) -> list[str]:
    """The names of the settings that name `needed()`'s fields."""
    text = (['messages_field'] if self.messages_field else
            ['prompt_field', 'completion_field'] if self.prompt_field else ['text_field'])
    return text + (['client_field'] if self.client_field else [])


class Block(NamedTuple):
  """Consecutive documents of one file."""

  texts: list[str]  # The texts (SFT: the completions; chat: the messages as JSON).
  prompts: list[str] | None  # SFT: the prompts.
  clients: list[str] | None  # The values of Fields.client_field.
  rows: list[int] | None = None  # Each document's JSONL line / Parquet row (from 1), to name it.


@dataclasses.dataclass
class Counts:
  """What reading skipped or repaired, and how far it got."""

  missing: int = 0  # Rows without a needed field (or a null / non-string value).
  empty: int = 0  # Documents with no text at all.
  replaced: int = 0  # Invalid UTF-8 sequences replaced by U+FFFD.
  bytes_done: int = 0  # Bytes of the files read so far (of the compressed file for .gz).

  def summary(self, fields: Fields) -> str | None:
    """One line naming what was skipped or replaced, or None."""
    parts = []
    if self.missing:
      parts.append(f'skipped {self.missing:,} rows without {" or ".join(fields.needed())}')
    if self.empty:
      parts.append(f'skipped {self.empty:,} empty documents')
    if self.replaced:
      parts.append(f'replaced {self.replaced:,} invalid UTF-8 sequences with U+FFFD')
    return '; '.join(parts) or None


def expand(files: str | Sequence[str], option: str = 'data.files') -> dict[str, Path]:
  """Name -> path of the files that the globs `files` match (`**` recurses), sorted and
  deduplicated; names are relative to the files' common directory, so a corpus moved elsewhere
  keeps them. A glob matching nothing, or a file of another type, is a UserError naming
  `option` (the setting that gave the globs)."""
  patterns = [files] if isinstance(files, str) else list(files)
  paths = set()
  for pattern in patterns:
    matches = [Path(m).resolve() for m in glob.glob(os.path.expanduser(pattern), recursive=True)
               if os.path.isfile(m)]
    if not matches:
      raise UserError(f'{option}: {pattern!r} matches no file')
    paths.update(matches)
  unique = sorted(paths)
  for path in unique:
    if not path.name.endswith(SUFFIXES):
      raise UserError(f'{option}: {path} is not a {", ".join(SUFFIXES)} file')
  root = unique[0].parent if len(unique) == 1 else Path(os.path.commonpath(unique))
  return {str(p.relative_to(root)): p for p in unique}


def decode(raw: bytes, counts: Counts) -> str:
  """UTF-8 `raw`, each invalid sequence replaced by U+FFFD and counted."""
  try:
    return raw.decode('utf-8')
  except UnicodeDecodeError:
    text = raw.decode('utf-8', 'replace')  # Valid U+FFFD in `raw` (EF BF BD) are not counted:
    counts.replaced += text.count('\ufffd') - raw.count(b'\xef\xbf\xbd')
    return text


def _json_lines(path: Path, lines: Iterable[bytes], counts: Counts) -> Iterator[tuple[int, Any]]:
  """(line number, parsed value) of each non-blank line; RunFailure for one that is not JSON."""
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      value = json.loads(decode(line, counts))
    except ValueError:
      raise RunFailure(f'{path}:{number}: not a JSON line') from None
    yield number, value


def json_rows(path: Path, kind: str) -> Iterator[tuple[int, dict[str, Any]]]:
  """(line number, row) of each non-blank line of a .jsonl or .jsonl.gz file of `kind` rows
  (named in the errors): RunFailure for a line that is not JSON or a file that cannot be read,
  UserError for a row that is not a JSON object."""
  opener = gzip.open if path.name.endswith('.gz') else open
  try:
    with opener(path, 'rb') as lines:
      for number, row in _json_lines(path, lines, Counts()):
        if not isinstance(row, dict):
          raise UserError(f'{path}:{number}: a {kind} row is a JSON object')
        yield number, row
  except (EOFError, OSError) as error:
    raise RunFailure(f'{path}: cannot read it ({error})') from None


def read(path: Path, fields: Fields, counts: Counts, options: str = 'data.fields.'
         ) -> Iterator[Block]:
  """The documents of one file in blocks, in file order; see the module docstring for bad
  input. Errors name the fields' settings as `options` + 'text_field' and so on."""
  name = path.name
  if fields.prompt_field and name.endswith('.txt'):
    raise UserError(f'{path}: SFT data (data.fields.prompt_field={fields.prompt_field!r}) needs '
                    'JSONL or Parquet rows, not .txt')
  if fields.messages_field and name.endswith('.txt'):
    raise UserError(f'{path}: chat data (data.fields.messages_field={fields.messages_field!r}) needs '
                    'JSONL or Parquet rows, not .txt')
  start = counts.bytes_done
  try:
    if name.endswith('.parquet'):
      yield from _parquet(path, fields, counts, options)
    else:
      with open(path, 'rb') as raw:
        if name.endswith('.gz'):
          with gzip.GzipFile(fileobj=raw) as lines:
            yield from _jsonl(path, lines, raw, fields, counts, start, options)
        elif name.endswith('.jsonl'):
          yield from _jsonl(path, raw, raw, fields, counts, start, options)
        else:
          yield from _txt(raw, fields.txt_document, counts, start)
  except (EOFError, zlib.error, gzip.BadGzipFile) as error:
    raise RunFailure(f'{path}: corrupt gzip data ({error})') from None
  except OSError as error:
    raise RunFailure(f'{path}: cannot read it ({error})') from None
  counts.bytes_done = start + path.stat().st_size


def _line_blocks(raw: BinaryIO, counts: Counts, start: int) -> Iterator[list[str]]:
  """The file's lines (without line ends), BLOCK_BYTES at a time, each block cut after a
  newline (which no UTF-8 sequence contains) and decoded in one call."""
  rest = b''
  while data := raw.read(BLOCK_BYTES):
    data, cut = rest + data, len(rest)
    cut = data.rfind(b'\n', cut) + 1
    rest = data[cut:] if cut else data
    counts.bytes_done = start + raw.tell()
    if cut:
      yield _lines(decode(data[:cut], counts))[:-1]
  if rest:
    yield _lines(decode(rest, counts))


def _lines(text: str) -> list[str]:
  """`text` split at newlines, each line without a trailing carriage return."""
  lines = text.split('\n')
  return [line.rstrip('\r') for line in lines] if '\r' in text else lines


def _txt(raw: BinaryIO, mode: str, counts: Counts, start: int) -> Iterator[Block]:
  if mode == 'file':
    text = decode(raw.read(), counts)
    if text.strip():
      yield Block([text], None, None)
    else:
      counts.empty += 1
    return
  paragraph: list[str] = []
  for lines in _line_blocks(raw, counts, start):
    if mode == 'line':
      yield Block(list(filter(str.strip, lines)), None, None)
      continue
    texts = []
    for line in lines:
      if line.strip():
        paragraph.append(line)
      elif paragraph:
        texts.append('\n'.join(paragraph))
        paragraph = []
    yield Block(texts, None, None)
  if paragraph:
    yield Block(['\n'.join(paragraph)], None, None)


def _jsonl(path: Path, lines: BinaryIO, raw: BinaryIO, fields: Fields, counts: Counts,
           start: int, options: str) -> Iterator[Block]:
  rows, missing, block = 0, counts.missing, _Rows(fields)
  for number, record in _json_lines(path, lines, counts):
    rows += 1
    block.add(record if isinstance(record, dict) else {}, counts, number)
    if len(block.texts) >= BLOCK_ROWS:
      counts.bytes_done = start + raw.tell()
      yield block.take()
  yield block.take()
  _check_some_rows(path, rows, counts.missing - missing, fields, options)


def _parquet(path: Path, fields: Fields, counts: Counts, options: str) -> Iterator[Block]:
  import pyarrow as pa  # Only a Parquet corpus needs pyarrow.
  import pyarrow.parquet as pq
  try:
    file = pq.ParquetFile(path)
    names = set(file.schema_arrow.names)
    absent = [f for f in fields.needed() if f not in names]
    if absent:
      raise UserError(f'{path}: no column {absent[0]!r} (columns: {", ".join(sorted(names))})')
    rows, missing, block = 0, counts.missing, _Rows(fields)
    size, total = path.stat().st_size, max(file.metadata.num_rows, 1)
    for batch in file.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=fields.needed()):
      columns = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
      for at, values in enumerate(zip(*columns), rows + 1):
        block.add(dict(zip(fields.needed(), values)), counts, at)
      rows += batch.num_rows
      counts.bytes_done += size * batch.num_rows // total
      yield block.take()
  except (pa.ArrowException, OSError) as error:
    raise RunFailure(f'{path}: unreadable Parquet file ({str(error).splitlines()[0]})') from None
  _check_some_rows(path, rows, counts.missing - missing, fields, options)


def _text(value: Any, counts: Counts) -> str | None:
  if isinstance(value, bytes):  # A Parquet binary column.
    return decode(value, counts)
  return value if isinstance(value, str) else None


class _Rows:
  """A block being filled from rows: each row's document, or (counted) none when a needed
  field is absent or not text, or the document is empty."""

  def __init__(self, fields: Fields):
    self.fields = fields
    self.texts: list[str] = []
    self.prompts: list[str] | None = [] if fields.prompt_field else None
    self.clients: list[str] | None = [] if fields.client_field else None
    self.rows: list[int] = []

  def add(self, row: dict[str, Any], counts: Counts, number: int) -> None:
    f = self.fields
    if f.messages_field:
      text = chat_rows.conversation_text(row.get(f.messages_field))
    else:
      text = _text(row.get(f.completion_field if f.prompt_field else f.text_field), counts)
    prompt = _text(row.get(f.prompt_field), counts) if f.prompt_field else None
    client = row.get(f.client_field) if f.client_field else None
    if text is None or (f.prompt_field and prompt is None) or (
        f.client_field and (client is None or isinstance(client, (dict, list)))):
      counts.missing += 1
    elif not text and not prompt:
      counts.empty += 1
    else:
      self.texts.append(text)
      self.rows.append(number)
      if self.prompts is not None:
        self.prompts.append(prompt)
      if self.clients is not None:
        self.clients.append(str(client))

  def take(self) -> Block:
    """The block so far; the next starts empty."""
    block = Block(self.texts, self.prompts, self.clients, self.rows)
    self.__init__(self.fields)
    return block


def _check_some_rows(path: Path, rows: int, missing: int, fields: Fields, options: str) -> None:
  """Every row of a file lacking a needed field is a config mistake, not a few bad rows."""
  if rows and missing == rows:
    settings = ' / '.join(options + name for name in fields.needed_names())
    raise UserError(f'{path}: none of its {rows:,} rows has {" and ".join(fields.needed())} '
                    f'(set {settings})')
