"""Preference rows (JSONL: `prompt`, `chosen`, `rejected`) as the documents of a token store.

Two row formats, as TRL reads them:
  text  `prompt`, `chosen`, `rejected` strings. A pair becomes two SFT documents, prompt +
        chosen and prompt + rejected (each + EOS, the completion's tokens scored), so both share
        the prompt's tokens exactly (prompt and completion are tokenized apart and joined).
  chat  `chosen` and `rejected` lists of messages ([{"role", "content"}, ...]); `prompt` a
        string (one user turn), a list of messages, or absent: then the messages that chosen and
        rejected begin with alike are the prompt. A pair becomes two conversations, prompt +
        chosen and prompt + rejected, rendered with the tokenizer's chat template.
A row without a string/list `chosen` or `rejected`, or whose two are equal, is bad input
(UserError naming file:line); a pair with an empty completion (or chat: no assistant message
after the prompt) is skipped and counted. The documents are written as JSONL beside the token
store (`pair_files`: chosen of pair i is document 2i, rejected 2i + 1), one file per source file
under its name, and the store is built from those with the store's own SFT or chat reading.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from paxlike.core import files as file_io
from paxlike.data import chat_rows
from paxlike.data import fingerprint
from paxlike.data import text_files
from paxlike.data import token_store
from paxlike.errors import UserError

FORMAT = 1
MANIFEST = 'pairs.json'
CLIENT_KEY = 'client'  # The derived rows' client field (partition='field').


@dataclasses.dataclass(frozen=True)
class PairFields:
  """The row fields of a pair, and of its client (partition='field')."""

  prompt_field: str = 'prompt'
  chosen_field: str = 'chosen'
  rejected_field: str = 'rejected'
  client_field: str | None = None


def _is_messages(value: Any) -> bool:
  return isinstance(value, list) and bool(value) and all(map(chat_rows.is_message, value))


def _common_messages(a: list[dict], b: list[dict]) -> list[dict]:
  """The messages that `a` and `b` begin with alike."""
  n = 0
  while n < min(len(a), len(b)) and a[n] == b[n]:
    n += 1
  return a[:n]


def pair_documents(row: dict[str, Any], fields: PairFields, where: str
                   ) -> tuple[str, dict | None, dict | None]:
  """(format 'text' or 'chat', chosen document, rejected document) of one row, the documents
  as the store's SFT ({'prompt', 'completion'}) or chat ({'messages'}) rows; (format, None,
  None) for a pair to skip (an empty completion). UserError naming `where` for bad input."""
  chosen, rejected = row.get(fields.chosen_field), row.get(fields.rejected_field)
  prompt = row.get(fields.prompt_field)
  for name, value in ((fields.chosen_field, chosen), (fields.rejected_field, rejected)):
    if not isinstance(value, (str, list)):
      raise UserError(f'{where}: {name!r} must be a string or a list of messages, got '
                      f'{type(value).__name__}')
  if chosen == rejected:
    raise UserError(f'{where}: {fields.chosen_field!r} and {fields.rejected_field!r} are equal '
                    '(a pair must prefer one of two different completions)')
  if isinstance(chosen, str) and isinstance(rejected, str):
    if not isinstance(prompt, str):
      raise UserError(f'{where}: text pairs need a string {fields.prompt_field!r}, got '
                      f'{type(prompt).__name__}')
    if not chosen or not rejected:
      return 'text', None, None
    return 'text', {'prompt': prompt, 'completion': chosen}, {'prompt': prompt,
                                                             'completion': rejected}
  if not (_is_messages(chosen) and _is_messages(rejected)):
    raise UserError(f'{where}: {fields.chosen_field!r} and {fields.rejected_field!r} must both '
                    'be strings or both lists of {"role", "content"} messages')
  if prompt is None:
    head = _common_messages(chosen, rejected)
  elif isinstance(prompt, str):
    head = [{'role': 'user', 'content': prompt}]
  elif _is_messages(prompt):
    head = prompt
  else:
    raise UserError(f'{where}: {fields.prompt_field!r} must be a string, a list of messages or '
                    f'absent, got {type(prompt).__name__}')
  convs = [tail if prompt is None else head + tail for tail in (chosen, rejected)]
  if not all(any(m['role'] == 'assistant' for m in c[len(head):]) for c in convs):
    return 'chat', None, None
  return 'chat', {'messages': convs[0]}, {'messages': convs[1]}


def write_documents(path: Path, out: Path, fields: PairFields) -> tuple[str | None, dict]:
  """Writes the pair documents of source `path` to `out`; (its format or None when it has no
  pair, {'pairs', 'skipped_pairs'})."""
  if not path.name.endswith(('.jsonl', '.jsonl.gz')):
    raise UserError(f'data.files: {path} is not a .jsonl or .jsonl.gz file (preference pairs '
                    'are JSONL rows)')
  kinds, counts = set(), {'pairs': 0, 'skipped_pairs': 0}
  with open(out, 'w', encoding='utf-8') as f:
    for number, row in text_files.json_rows(path, 'preference'):
      kind, chosen, rejected = pair_documents(row, fields, f'{path}:{number}')
      kinds.add(kind)
      if len(kinds) > 1:
        raise UserError(f'{path}:{number}: text and chat pairs are mixed; use one format')
      if chosen is None:
        counts['skipped_pairs'] += 1
        continue
      if fields.client_field:
        client = row.get(fields.client_field)
        if client is None or isinstance(client, (dict, list)):
          raise UserError(f'{path}:{number}: no {fields.client_field!r} (data.client_field)')
        chosen, rejected = ({**d, CLIENT_KEY: str(client)} for d in (chosen, rejected))
      for document in (chosen, rejected):
        f.write(json.dumps(document, ensure_ascii=False) + '\n')
      counts['pairs'] += 1
  return (kinds.pop() if kinds else None), counts


def pair_files(files: dict[str, Path], fields: PairFields) -> tuple[dict[str, Path], dict]:
  """The pair documents of `files` (name -> path), made once per content and fields in the token
  dir: (name -> derived file, {'format', 'pairs', 'skipped_pairs'}). UserError when no file
  holds a pair or the files mix formats."""
  spec = json.dumps([FORMAT, fingerprint.digest(files), dataclasses.asdict(fields)])
  final = token_store.token_dir() / 'pairs' / hashlib.sha256(spec.encode()).hexdigest()[:32]
  if not (final / MANIFEST).is_file():
    _write_pairs(files, fields, final)
  manifest = json.loads((final / MANIFEST).read_text())
  return {name: final / _derived_name(name) for name in files}, manifest


def _derived_name(name: str) -> str:
  return name[:-3] if name.endswith('.gz') else name


def _write_pairs(files: dict[str, Path], fields: PairFields, final: Path) -> None:
  """Writes every file's documents and the manifest into a temporary directory, then moves it
  into place (a concurrent writer's finished copy wins)."""
  try:
    with file_io.dir_written(final) as tmp:
      manifest = _write_documents_into(tmp, files, fields)
      (tmp / MANIFEST).write_text(json.dumps(manifest) + '\n')
  except OSError:  # Another run put its copy in place first.
    if not (final / MANIFEST).is_file():
      raise


def _write_documents_into(tmp: Path, files: dict[str, Path], fields: PairFields) -> dict:
  """Writes every file's documents under `tmp`; the manifest. UserError when no file holds a
  pair or the files mix formats."""
  kinds, totals = set(), {'pairs': 0, 'skipped_pairs': 0}
  for name, path in files.items():
    (tmp / _derived_name(name)).parent.mkdir(parents=True, exist_ok=True)
    kind, counts = write_documents(path, tmp / _derived_name(name), fields)
    kinds |= {kind} - {None}
    totals = {k: totals[k] + counts[k] for k in totals}
  if len(kinds) > 1:
    raise UserError('data.files: some files hold text pairs and others chat pairs; use one '
                    'format')
  if not totals['pairs']:
    raise UserError(f'data.files: the {len(files)} files hold no preference pair'
                    + (f' ({totals["skipped_pairs"]} skipped with an empty completion)'
                       if totals['skipped_pairs'] else ''))
  return {'format': kinds.pop(), **totals}


def store_fields(kind: str, fields: PairFields) -> text_files.Fields:
  """How the store reads the derived documents of format `kind`."""
  client = CLIENT_KEY if fields.client_field else None
  if kind == 'chat':
    return text_files.Fields(messages_field='messages', client_field=client)
  return text_files.Fields(prompt_field='prompt', completion_field='completion',
                           client_field=client)
