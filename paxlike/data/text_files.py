"""A user's corpus: globs of `.txt`, `.jsonl`, `.jsonl.gz` and `.parquet` files read as documents.

Rows without the field are counted and skipped (a file where every row lacks it is a
UserError); bytes that are not UTF-8 are replaced by U+FFFD and counted; a truncated `.gz`, a
line that is not JSON, or an unreadable Parquet file is corrupt data (RunFailure naming the
file). Files are read as streams (Parquet in record batches), so memory does not grow with them.
"""

import dataclasses
import glob
import gzip
import json
import os
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

from paxlike.errors import RunFailure, UserError

SUFFIXES = ('.txt', '.jsonl', '.jsonl.gz', '.parquet')
TXT_DOCUMENTS = ('file', 'line', 'paragraph')
PARQUET_BATCH_ROWS = 1024


@dataclasses.dataclass(frozen=True)
class Fields:
  """How files become documents: the JSONL/Parquet `text_field`; a `.txt` file is one document
  per file, per line or per paragraph (blank-line separated); with `prompt_field` set, a row is
  an SFT example of `prompt_field` + `completion_field`; `client_field` names each row's client."""

  text_field: str = 'text'
  txt_document: str = 'file'
  prompt_field: str | None = None
  completion_field: str = 'completion'
  client_field: str | None = None

  def needed(self) -> list[str]:
    """The row fields a document needs."""
    text = ([self.prompt_field, self.completion_field] if self.prompt_field else
            [self.text_field])
    return text + ([self.client_field] if self.client_field else [])


class Document(NamedTuple):
  text: str  # The text (SFT: the completion).
  prompt: str | None  # SFT: the prompt.
  client: str | None  # The value of Fields.client_field.


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


def expand(files: str | Sequence[str]) -> dict[str, Path]:
  """Name -> path of the files that the globs `files` match (`**` recurses), sorted and
  deduplicated; names are relative to the files' common directory, so a corpus moved elsewhere
  keeps them. A glob matching nothing, or a file of another type, is a UserError."""
  patterns = [files] if isinstance(files, str) else list(files)
  paths = set()
  for pattern in patterns:
    matches = [Path(m).resolve() for m in glob.glob(os.path.expanduser(pattern), recursive=True)
               if os.path.isfile(m)]
    if not matches:
      raise UserError(f'data.files: {pattern!r} matches no file')
    paths.update(matches)
  unique = sorted(paths)
  for path in unique:
    if not path.name.endswith(SUFFIXES):
      raise UserError(f'data.files: {path} is not a {", ".join(SUFFIXES)} file')
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


def read(path: Path, fields: Fields, counts: Counts) -> Iterator[Document]:
  """The documents of one file, in file order; see the module docstring for bad input."""
  name = path.name
  if fields.prompt_field and name.endswith('.txt'):
    raise UserError(f'{path}: SFT data (data.prompt_field={fields.prompt_field!r}) needs '
                    'JSONL or Parquet rows, not .txt')
  start = counts.bytes_done
  try:
    if name.endswith('.parquet'):
      yield from _parquet(path, fields, counts)
    else:
      with open(path, 'rb') as raw:
        if name.endswith('.gz'):
          with gzip.GzipFile(fileobj=raw) as lines:
            yield from _jsonl(path, lines, raw, fields, counts, start)
        elif name.endswith('.jsonl'):
          yield from _jsonl(path, raw, raw, fields, counts, start)
        else:
          yield from _txt(raw, fields.txt_document, counts, start)
  except (EOFError, zlib.error, gzip.BadGzipFile) as error:
    raise RunFailure(f'{path}: corrupt gzip data ({error})') from None
  except OSError as error:
    raise RunFailure(f'{path}: cannot read it ({error})') from None
  counts.bytes_done = start + path.stat().st_size


def _txt(raw: BinaryIO, mode: str, counts: Counts, start: int) -> Iterator[Document]:
  if mode == 'file':
    text = decode(raw.read(), counts)
    if text.strip():
      yield Document(text, None, None)
    else:
      counts.empty += 1
    return
  block: list[str] = []
  for line in raw:
    text = decode(line, counts).rstrip('\r\n')
    counts.bytes_done = start + raw.tell()
    if mode == 'line':
      if text.strip():
        yield Document(text, None, None)
    elif text.strip():
      block.append(text)
    elif block:
      yield Document('\n'.join(block), None, None)
      block = []
  if block:
    yield Document('\n'.join(block), None, None)


def _jsonl(path: Path, lines: BinaryIO, raw: BinaryIO, fields: Fields, counts: Counts,
           start: int) -> Iterator[Document]:
  rows, missing = 0, counts.missing
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      record = json.loads(decode(line, counts))
    except ValueError:
      raise RunFailure(f'{path}:{number}: not a JSON line') from None
    rows += 1
    counts.bytes_done = start + raw.tell()
    doc = _document(record if isinstance(record, dict) else {}, fields, counts)
    if doc:
      yield doc
  _check_some_rows(path, rows, counts.missing - missing, fields)


def _parquet(path: Path, fields: Fields, counts: Counts) -> Iterator[Document]:
  import pyarrow as pa  # Only a Parquet corpus needs pyarrow.
  import pyarrow.parquet as pq
  try:
    file = pq.ParquetFile(path)
    names = set(file.schema_arrow.names)
    absent = [f for f in fields.needed() if f not in names]
    if absent:
      raise UserError(f'{path}: no column {absent[0]!r} (columns: {", ".join(sorted(names))})')
    rows, missing = 0, counts.missing
    size, total = path.stat().st_size, max(file.metadata.num_rows, 1)
    for batch in file.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=fields.needed()):
      columns = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
      for values in zip(*columns):
        rows += 1
        doc = _document(dict(zip(fields.needed(), values)), fields, counts)
        if doc:
          yield doc
      counts.bytes_done += size * batch.num_rows // total
  except (pa.ArrowException, OSError) as error:
    raise RunFailure(f'{path}: unreadable Parquet file ({str(error).splitlines()[0]})') from None
  _check_some_rows(path, rows, counts.missing - missing, fields)


def _text(value: Any, counts: Counts) -> str | None:
  if isinstance(value, bytes):  # A Parquet binary column.
    return decode(value, counts)
  return value if isinstance(value, str) else None


def _document(row: dict[str, Any], fields: Fields, counts: Counts) -> Document | None:
  """The row's document; None (counted) when a needed field is absent or not text."""
  client = None
  if fields.client_field:
    client = row.get(fields.client_field)
    client = None if client is None or isinstance(client, (dict, list)) else str(client)
  text = _text(row.get(fields.completion_field if fields.prompt_field else fields.text_field),
               counts)
  prompt = _text(row.get(fields.prompt_field), counts) if fields.prompt_field else None
  if text is None or (fields.prompt_field and prompt is None) or (
      fields.client_field and client is None):
    counts.missing += 1
    return None
  if not text and not prompt:
    counts.empty += 1
    return None
  return Document(text, prompt, client)


def _check_some_rows(path: Path, rows: int, missing: int, fields: Fields) -> None:
  """Every row of a file lacking a needed field is a config mistake, not a few bad rows."""
  if rows and missing == rows:
    raise UserError(f'{path}: none of its {rows:,} rows has {" and ".join(fields.needed())} '
                    '(set data.text_field / data.prompt_field / data.client_field)')
