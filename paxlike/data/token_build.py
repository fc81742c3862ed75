"""Tokenizing a corpus for the token store: documents in chunks, encoded while the next chunk
is read.

The main thread reads the files (text_files.read), cuts the documents into chunks of about
CHUNK_BYTES of the files, hashes each chunk's documents for the held-out split (doc_hash, a few
numpy passes per chunk) and writes the results; each chunk is encoded with one
`tokenizer.encode_flat` call per field (the library's batch encode, its ids flattened in one
pass) and joined with an EOS after every document (tokenizers/documents.py). No step does
Python work per document.

`num_workers` encoders run beside the main thread, at most two chunks in flight each (memory
stays bounded), and results come back in corpus order. Each encoder calls the library with
cores // num_workers threads (encoder_threads). The encoders are threads: both libraries encode
without the GIL, but turn their ids into Python lists under it on the calling thread, so a
second encoder encodes while the first converts; overlap hides that work only in a core's idle
time. With PROCESS_MIN_WORKERS workers or more and a corpus of at least POOL_MIN_BYTES, the
encoders are spawned processes (a forked child of a process running JAX's threads may
deadlock), which also convert in parallel, after a start-up of a second or more (each imports
the tokenizers and the parent's main module): they pay off only with several workers on a
large corpus. The figures behind both thresholds: docs/benchmarks.md
(benchmarks/data_pipeline.py, `build`).
"""

import collections
import concurrent.futures
import dataclasses
import functools
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from paxlike.data import doc_hash
from paxlike.data import text_files
from paxlike.errors import UserError
from paxlike.tokenizers import documents

CHUNK_BYTES = 1 << 20
CHUNK_DOCS = 8192
POOL_MIN_BYTES = 16 << 20
PROCESS_MIN_WORKERS = 3
PROGRESS_EVERY_S = 5.0


@dataclasses.dataclass(frozen=True)
class Encoded:
  """A chunk's documents tokenized: tokens back to back, each document followed by EOS."""

  tokens: np.ndarray  # The store's dtype [sum(lengths)].
  lengths: np.ndarray  # int64 [docs], EOS included.
  hashes: np.ndarray  # uint64 [docs]: doc_hash of each document's text (SFT: prompt \0 text).
  prompt_lengths: np.ndarray  # int32 [docs]: prompt tokens (0 without a prompt).
  trained: np.ndarray | None = None  # bool [sum(lengths)]: chat data's assistant tokens.


@dataclasses.dataclass
class Chunk:
  """Documents on their way to the encoder, and what the store keeps of them besides."""

  texts: list[str] = dataclasses.field(default_factory=list)
  prompts: list[str] | None = None
  files: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (file, documents)
  clients: list[str] = dataclasses.field(default_factory=list)  # With a client_field.
  rows: list[int] = dataclasses.field(default_factory=list)  # Line / row in its file (0: none).
  start: int = 0  # Bytes of the files read before the chunk's first block.

  def file_ids(self) -> np.ndarray:
    """int32 [docs]: each document's file (index into the store's files)."""
    runs = np.array(self.files, np.int64).reshape(-1, 2)
    return np.repeat(runs[:, 0], runs[:, 1]).astype(np.int32)


def text_hashes(texts: list[str], prompts: list[str] | None) -> np.ndarray:
  """uint64 [docs]: the doc_hash of each document (SFT: prompt \\0 completion), which places it
  in the held-out split or not."""
  return doc_hash.hashes(texts if prompts is None else list(map('\0'.join, zip(prompts, texts))))


def chunks(files: dict[str, Path], fields: text_files.Fields,
           counts: text_files.Counts) -> Iterator[Chunk]:
  """The corpus's documents, file after file, in chunks of whole blocks of text_files.read,
  cut once they hold CHUNK_DOCS documents or CHUNK_BYTES bytes of the files have been read
  into them (of a .gz its compressed bytes; counting characters would cost a call per
  document)."""
  sft = fields.prompt_field is not None
  chunk = Chunk(prompts=[] if sft else None)
  for index, path in enumerate(files.values()):
    for block in text_files.read(path, fields, counts):
      chunk.texts += block.texts
      if sft:
        chunk.prompts += block.prompts
      chunk.files.append((index, len(block.texts)))
      chunk.clients += block.clients or ()
      chunk.rows += block.rows if block.rows is not None else [0] * len(block.texts)
      if (counts.bytes_done - chunk.start >= CHUNK_BYTES
          or len(chunk.texts) >= CHUNK_DOCS):
        yield chunk
        chunk = Chunk(prompts=[] if sft else None, start=counts.bytes_done)
  if chunk.texts:
    yield chunk


def encoder_threads(num_workers: int) -> int:
  """The library threads each of `num_workers` encoders calls its batch encode with."""
  return max(1, (os.cpu_count() or 1) // num_workers)


def encoded_chunks(files: dict[str, Path], fields: text_files.Fields,
                   counts: text_files.Counts, tokenizer: Any, dtype: np.dtype,
                   num_workers: int) -> Iterator[tuple[Chunk, Encoded]]:
  """Each chunk (texts dropped) with its encoding into `dtype` ids, in corpus order, encoded by
  `num_workers` threads or spawned processes (see the module docstring)."""
  workers = max(num_workers, 1)
  size = sum(p.stat().st_size for p in files.values())
  if workers < PROCESS_MIN_WORKERS or size < POOL_MIN_BYTES:
    executor = concurrent.futures.ThreadPoolExecutor(workers, 'tokenize')
    encode = functools.partial(documents.encode_documents, tokenizer, dtype,
                               encoder_threads(workers))
  else:
    executor = concurrent.futures.ProcessPoolExecutor(
        workers, multiprocessing.get_context('spawn'), documents.init_worker,
        (tokenizer, dtype, encoder_threads(workers)))
    encode = documents.encode_in_worker
  with executor:
    pending: collections.deque = collections.deque()
    for chunk in chunks(files, fields, counts):
      future = executor.submit(encode, chunk.texts, chunk.prompts)
      pending.append((_without_text(chunk), text_hashes(chunk.texts, chunk.prompts), future))
      if len(pending) >= 2 * workers:
        yield _done(pending.popleft(), files)
    while pending:
      yield _done(pending.popleft(), files)


def _done(item: tuple[Chunk, np.ndarray, concurrent.futures.Future], files: dict[str, Path]
          ) -> tuple[Chunk, Encoded]:
  meta, hashes, future = item
  try:
    tokens, lengths, prompt_lengths, trained = future.result()
  except documents.DocumentRefused as error:
    raise UserError(f'{where(meta, error.index, files)}: {error.message}') from None
  return meta, Encoded(tokens, lengths, hashes, prompt_lengths, trained)


def where(chunk: Chunk, index: int, files: dict[str, Path]) -> str:
  """'FILE:LINE' of the chunk's document `index` ('FILE: row N' in Parquet, 'FILE' alone
  where its reader keeps no number)."""
  path = list(files.values())[int(chunk.file_ids()[index])]
  row = chunk.rows[index] if index < len(chunk.rows) else 0
  if not row:
    return str(path)
  return f'{path}: row {row}' if path.name.endswith('.parquet') else f'{path}:{row}'


def _without_text(chunk: Chunk) -> Chunk:
  return dataclasses.replace(chunk, texts=[], prompts=None)


class Progress:
  """A line on stderr every PROGRESS_EVERY_S seconds: documents, tokens/s, share read, ETA."""

  def __init__(self, total_bytes: int, counts: text_files.Counts):
    self.total, self.counts = max(total_bytes, 1), counts
    self.start = self.last = time.perf_counter()

  def update(self, docs: int, tokens: int) -> None:
    now = time.perf_counter()
    if now - self.last < PROGRESS_EVERY_S:
      return
    self.last, elapsed = now, now - self.start
    share = min(self.counts.bytes_done / self.total, 1.0)
    eta = elapsed * (1 - share) / share if share > 0 else float('nan')
    print(f'tokenizing: {docs:,} documents, {tokens:,} tokens, {tokens / elapsed:,.0f} '
          f'tokens/s, {share:.0%} read, ETA {eta:.0f} s', file=sys.stderr, flush=True)

  def done(self, docs: int, tokens: int, summary: str | None) -> None:
    elapsed = time.perf_counter() - self.start
    print(f'tokenized {docs:,} documents into {tokens:,} tokens in {elapsed:.1f} s '
          f'({tokens / max(elapsed, 1e-9):,.0f} tokens/s)' + (f'; {summary}' if summary else ''),
          file=sys.stderr, flush=True)
