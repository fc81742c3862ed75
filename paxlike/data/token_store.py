"""The token store: a corpus tokenized once into memory-mapped files that every run reuses.

`<token_dir()>/<key>/`, where the key hashes the files' names and contents, the tokenizer's
fingerprint, the reading fields (text_files.Fields) and FORMAT; the files' content hashes come
from the token dir's file_hashes.json while their stat is unchanged (file_hashes.py), so a
start on an existing store reads no corpus byte:
  tokens-00000.bin ...  token ids (uint16 when the vocab fits, else uint32): the documents back
                        to back, each followed by EOS (SFT: prompt, completion, EOS)
  doc_start.bin   int64  [docs + 1]  each document's first token in the store, then the end
  doc_file.bin    int32  [docs]      its file (index into manifest['files'])
  doc_client.bin  int32  [docs]      its client_field value (index into clients.json), else 0
  doc_hash.bin    uint64 [docs]      doc_hash.hashes of its text: held out when below
                                     eval_fraction * 2**64, so the split is stable when files
                                     are added and eval_fraction is not part of the key
  doc_prompt.bin  int32  [docs]      its prompt tokens (SFT), else 0
  trained.bin     uint8  [tokens]    chat data only: 1 where a token is assistant output (a
                                     target), 0 elsewhere (tokenizers/chat_encoder.py)
  manifest.json   written last; it records each file's size and CRC-32 (store_check.py)
  derived/NAME.vN/  arrays computed from the store (packing plans) by version N of their code,
                  cached the same way

A build writes into a temporary directory and `os.replace`s it into place under an exclusive
lock, so concurrent runs build once; a directory without its manifest (a killed build) is never
read, and is removed by the next build. Everything is read through memory maps.
"""

import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from paxlike.core import files as file_io
from paxlike.data import atomic_dirs
from paxlike.data import file_hashes
from paxlike.data import fingerprint
from paxlike.data import store_check
from paxlike.data import text_files
from paxlike.data import token_build
from paxlike.errors import RunFailure, UserError

FORMAT = 2  # The files' layout and doc_hash's hash: a store of another format is rebuilt.
TOKEN_DIR_ENV = 'PAXLIKE_TOKEN_DIR'
VERIFY_ENV = 'PAXLIKE_VERIFY_DATA'
MANIFEST = 'manifest.json'
TRAINED = 'trained.bin'
SHARD_TOKENS = 1 << 30  # A new shard starts (between chunks) once a shard holds this many.
DOC_ARRAYS = {'doc_start': np.int64, 'doc_file': np.int32, 'doc_client': np.int32,
              'doc_hash': np.uint64, 'doc_prompt': np.int32}


def token_dir() -> Path:
  """$PAXLIKE_TOKEN_DIR, else ~/.cache/paxlike/tokens."""
  return Path(os.environ.get(TOKEN_DIR_ENV) or '~/.cache/paxlike/tokens').expanduser()


def token_dtype(vocab_size: int) -> np.dtype:
  return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def store_key(files: dict[str, Path], fields: text_files.Fields, tokenizer: Any,
              verify: bool = False) -> str:
  """sha256 of everything the store's contents depend on. The files' content hashes come from
  the token dir's index while their stat is unchanged; `verify`: every file is read again."""
  hashes = file_hashes.content_hashes(files, token_dir() / file_hashes.INDEX, verify)
  fields_spec = dataclasses.asdict(fields)
  if fields_spec.get('messages_field') is None:  # Stores made before chat data keep their key.
    fields_spec.pop('messages_field', None)
  spec = {'format': FORMAT, 'files': fingerprint.combined(hashes),
          'tokenizer': [tokenizer.fingerprint, tokenizer.vocab_size, tokenizer.eos_id],
          'fields': fields_spec}
  if fields.prompt_field is not None:  # Prompt + completion rows: how they are tokenized.
    spec['prompt_rows'] = {'boundary': 'common_prefix',
                           'bos_prefix': list(getattr(tokenizer, 'bos_prefix', ()))}
  return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class Store:
  """A complete store, memory-mapped read-only."""

  path: Path
  manifest: dict[str, Any]
  shards: tuple[np.ndarray, ...]
  shard_start: np.ndarray  # int64 [shards + 1]: each shard's first token.
  doc_start: np.ndarray
  doc_file: np.ndarray
  doc_client: np.ndarray
  doc_hash: np.ndarray
  doc_prompt: np.ndarray
  trained: np.ndarray | None = None  # uint8 [tokens], chat data only (trained.bin).

  @classmethod
  def open(cls, path: Path) -> 'Store':
    """The store at `path`; DamagedStore when a file is missing, cut short or changed."""
    manifest = json.loads((path / MANIFEST).read_text())
    dtype, docs = np.dtype(manifest['token_dtype']), manifest['num_docs']
    sizes = store_check.expected_sizes(
        manifest, {name: np.dtype(t).itemsize for name, t in DOC_ARRAYS.items()})
    if (path / TRAINED).is_file() or TRAINED in manifest.get('checksums', {}):
      sizes[TRAINED] = manifest['num_tokens']
    problem = store_check.damage(path, sizes, manifest.get('checksums'))
    if problem:
      raise DamagedStore(problem)
    sizes = manifest['shards']
    shards = tuple(np.memmap(path / f'tokens-{i:05d}.bin', dtype, 'r', shape=(n,))
                   for i, n in enumerate(sizes))
    arrays = {name: np.memmap(path / f'{name}.bin', dtype, 'r',
                              shape=(docs + (name == 'doc_start'),))
              for name, dtype in DOC_ARRAYS.items()}
    trained = (np.memmap(path / TRAINED, np.uint8, 'r', shape=(manifest['num_tokens'],))
               if (path / TRAINED).is_file() else None)
    return cls(path, manifest, shards, np.concatenate([[0], np.cumsum(sizes)]), **arrays,
               trained=trained)

  @property
  def num_docs(self) -> int:
    return self.manifest['num_docs']

  def tokens_at(self, index: np.ndarray) -> np.ndarray:
    """The token ids at int64 store positions `index` (any shape)."""
    if len(self.shards) == 1:
      return self.shards[0][index]
    shard = np.searchsorted(self.shard_start, index, side='right') - 1
    out = np.empty(np.shape(index), self.shards[0].dtype)
    for s in np.unique(shard).tolist():
      at = shard == s
      out[at] = self.shards[s][index[at] - self.shard_start[s]]
    return out

  def trained_at(self, index: np.ndarray) -> np.ndarray:
    """bool, shaped as `index`: whether the tokens at store positions `index` are assistant
    output (chat data; a store without trained.bin has no such mask)."""
    return np.asarray(self.trained[index], bool)

  def heldout(self, fraction: float) -> np.ndarray:
    """bool [docs]: the documents of the held-out split for `eval_fraction=fraction`."""
    return np.asarray(self.doc_hash) < np.uint64(min(int(fraction * 2.0**64), 2**64 - 1))


class DamagedStore(Exception):
  """A store whose files are not what its build wrote (see store_check)."""


class Writer:
  """Appends encoded chunks to a store directory; `finish` writes the manifest last."""

  def __init__(self, directory: Path, dtype: np.dtype, shard_tokens: int = SHARD_TOKENS):
    self.directory, self.dtype, self.shard_tokens = directory, np.dtype(dtype), shard_tokens
    self.docs = {name: open(directory / f'{name}.bin', 'wb') for name in DOC_ARRAYS}
    self.checksums = store_check.Checksums()
    self._write(self.docs['doc_start'], np.zeros(1, np.int64))
    self.shards: list[int] = []
    self.shard = None
    self.trained = None  # trained.bin, opened by the first chunk that has a mask.
    self.num_docs = self.num_tokens = 0

  def add(self, chunk: token_build.Encoded, files: np.ndarray, clients: np.ndarray) -> None:
    """Documents of `chunk`, from files `files` and of clients `clients` (int32 each)."""
    if self.shard is None or self.shards[-1] >= self.shard_tokens:
      if self.shard is not None:
        self.shard.close()
      self.shard = open(self.directory / f'tokens-{len(self.shards):05d}.bin', 'wb')
      self.shards.append(0)
    self._write(self.shard, np.ascontiguousarray(chunk.tokens, self.dtype))
    if chunk.trained is not None:
      if self.trained is None:
        self.trained = open(self.directory / TRAINED, 'wb')
      self._write(self.trained, np.ascontiguousarray(chunk.trained, np.uint8))
    ends = self.num_tokens + np.cumsum(chunk.lengths, dtype=np.int64)
    for name, values in (('doc_start', ends), ('doc_file', files), ('doc_client', clients),
                         ('doc_hash', chunk.hashes), ('doc_prompt', chunk.prompt_lengths)):
      self._write(self.docs[name], np.ascontiguousarray(values, DOC_ARRAYS[name]))
    self.shards[-1] += len(chunk.tokens)
    self.num_docs += len(chunk.lengths)
    self.num_tokens += len(chunk.tokens)

  def _write(self, file: Any, values: np.ndarray) -> None:
    """Appends `values`' bytes to `file`, and to its running checksum."""
    file.write(values.data)
    self.checksums.add(Path(file.name).name, values.data)

  def finish(self, manifest: dict[str, Any]) -> dict[str, Any]:
    """Flushes every file to disk, then writes the manifest (what makes the store complete)."""
    for f in [*self.docs.values(), *(f for f in (self.shard, self.trained) if f)]:
      f.flush()
      os.fsync(f.fileno())
      f.close()
    manifest = {**manifest, 'format': FORMAT, 'num_docs': self.num_docs,
                'num_tokens': self.num_tokens, 'token_dtype': self.dtype.name,
                'shards': self.shards, 'checksums': self.checksums.record()}
    file_io.write_json(self.directory / MANIFEST, manifest, indent=1)
    return manifest


def _complete(path: Path, key: str) -> bool:
  """Whether `path` holds a store of `key` in this FORMAT, whole (its manifest is written
  last)."""
  try:
    manifest = json.loads((path / MANIFEST).read_text())
  except (OSError, ValueError):
    return False
  return manifest.get('key') == key and manifest.get('format') == FORMAT


def verify_requested() -> bool:
  """Whether --verify_data ($PAXLIKE_VERIFY_DATA=1) asks to read the corpus and the store again
  instead of trusting their recorded stat."""
  return os.environ.get(VERIFY_ENV, '') not in ('', '0')


def open_or_build(files: dict[str, Path], fields: text_files.Fields, tokenizer: Any,
                  num_workers: int, verify: bool | None = None) -> Store:
  """The store of `files` read with `fields` and tokenized by `tokenizer`: opened if complete,
  else built (by `num_workers` encoders, see token_build.py) first. A file is read only to be
  hashed when its stat changed since it was last hashed (or that hash is not yet trusted:
  file_hashes.py), and to be tokenized when its store is built. `verify` (None:
  `verify_requested()`): every file is hashed again and the store's checksums are read again.
  A store damaged on disk (store_check: a file cut short or changed) is rebuilt, with a
  warning; UserError when the token dir cannot be used."""
  verify = verify_requested() if verify is None else verify
  directory = _usable_token_dir()
  key = store_key(files, fields, tokenizer, verify)
  final = directory / key[:32]
  lock = final.parent / f'.{final.name}.lock'

  def write(tmp: Path) -> None:
    build(tmp, files, fields, tokenizer, num_workers, key)

  is_complete = lambda path: _complete(path, key)
  if not is_complete(final):
    atomic_dirs.replace_atomically(final, lock, is_complete, write)
  elif verify:  # Its files' checksums are read again (store_check.damage).
    (final / store_check.VERIFIED).unlink(missing_ok=True)
  try:
    return Store.open(final)
  except DamagedStore as error:
    print(f'warning: token store {final} is damaged ({error}); rebuilding it from data.files',
          file=sys.stderr)
  atomic_dirs.remove(final, lock)
  atomic_dirs.replace_atomically(final, lock, is_complete, write)
  try:
    return Store.open(final)
  except DamagedStore as error:
    raise RunFailure(f'token store {final} is damaged right after its build ({error}); check '
                     f'the disk, or set ${TOKEN_DIR_ENV} to another directory') from None


def _usable_token_dir() -> Path:
  """`token_dir()`, created if needed; UserError naming it when it cannot be used."""
  path = token_dir()
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError as error:
    raise UserError(f'token store dir {path} (${TOKEN_DIR_ENV}) cannot be created '
                    f'({error.strerror})') from None
  if not os.access(path, os.W_OK | os.X_OK):
    raise UserError(f'token store dir {path} (${TOKEN_DIR_ENV}) is not writable')
  return path


def build(directory: Path, files: dict[str, Path], fields: text_files.Fields, tokenizer: Any,
          num_workers: int, key: str) -> dict[str, Any]:
  """Reads, tokenizes and writes the store into `directory` (see token_build.encoded_chunks)."""
  counts, clients = text_files.Counts(), {}
  writer = Writer(directory, token_dtype(tokenizer.vocab_size))
  progress = token_build.Progress(sum(p.stat().st_size for p in files.values()), counts)
  for meta, encoded in token_build.encoded_chunks(files, fields, counts, tokenizer,
                                                  writer.dtype, num_workers):
    client_ids = ([clients.setdefault(c, len(clients)) for c in meta.clients]
                  if fields.client_field else np.zeros(len(encoded.lengths)))
    writer.add(encoded, meta.file_ids(), np.asarray(client_ids, np.int32))
    progress.update(writer.num_docs, writer.num_tokens)
  if not writer.num_docs:
    raise UserError(f'data.files: the {len(files)} files hold no documents'
                    + (f' ({summary})' if (summary := counts.summary(fields)) else ''))
  progress.done(writer.num_docs, writer.num_tokens, counts.summary(fields))
  file_io.write_json(directory / 'clients.json', list(clients), indent=1)
  return writer.finish({**base_manifest(key, files, fields, tokenizer),
                        'counts': {'missing': counts.missing, 'empty': counts.empty,
                                   'replaced': counts.replaced}})


def base_manifest(key: str, files: dict[str, Path], fields: text_files.Fields,
                  tokenizer: Any) -> dict[str, Any]:
  """What a manifest says of the store's inputs (Writer.finish adds its contents)."""
  return {'key': key, 'files': list(files), 'fields': dataclasses.asdict(fields),
          'tokenizer': {'kind': tokenizer.kind, 'fingerprint': tokenizer.fingerprint,
                        'path': tokenizer.path, 'vocab_size': tokenizer.vocab_size,
                        'eos_id': tokenizer.eos_id, 'pad_id': tokenizer.pad_id,
                        'bos_id': tokenizer.bos_id}}


def client_names(store: Store) -> list[str]:
  """The client_field values of the store's documents, by doc_client index."""
  return json.loads((store.path / 'clients.json').read_text())


def derived(store: Store, name: str, version: int,
            make: Callable[[], tuple[dict[str, np.ndarray], dict]]
            ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  """Arrays and metadata `make()` computes from `store`, cached in `store.path/derived/
  name.v<version>` (made once, atomically, under the store's lock), then memory-mapped.
  `version` names the code that makes them (e.g. packing.PLAN_VERSION): a new one is not
  served what an older version cached."""
  final = store.path / 'derived' / f'{name}.v{version}'
  if not (final / MANIFEST).is_file():
    def write(tmp: Path) -> None:
      arrays, meta = make()
      for key, value in arrays.items():
        np.save(tmp / f'{key}.npy', value)
      file_io.write_json(tmp / MANIFEST, meta, indent=1)
    atomic_dirs.replace_atomically(final, store.path.parent / f'.{store.path.name}.lock',
                                   lambda path: (path / MANIFEST).is_file(), write)
  arrays = {p.stem: np.load(p, mmap_mode='r') for p in sorted(final.glob('*.npy'))}
  return arrays, json.loads((final / MANIFEST).read_text())
