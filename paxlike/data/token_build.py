"""Tokenizing a corpus for the token store: documents in chunks, encoded by worker threads or
processes.

The main thread reads the files (text_files.read), cuts the documents into chunks of about
CHUNK_CHARS characters and writes the results; each chunk is encoded with one
`tokenizer.encode_batch` call (per field), EOS appended to every document, and each document's
text hashed for the held-out split. With `num_workers` > 1, at most two chunks per worker are in
flight (memory stays bounded) and results come back in corpus order. The workers are threads
for a corpus under POOL_MIN_BYTES: SentencePiece and Hugging Face tokenizers encode without the
GIL, so the threads overlap with reading, hashing and writing at no start-up cost; a larger
corpus goes to spawned processes (a forked child of a process running JAX's threads may
deadlock), which also run the per-document Python work (array conversion, hashing) in
parallel, after a start-up of about a second (each imports paxlike and the tokenizer).
benchmarks/data_pipeline.py measures the three against the tokenizer library alone.
"""

import collections
import concurrent.futures
import dataclasses
import functools
import hashlib
import multiprocessing
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from paxlike.data import text_files

CHUNK_CHARS = 1 << 20
CHUNK_DOCS = 8192
POOL_MIN_BYTES = 16 << 20
PROGRESS_EVERY_S = 5.0


@dataclasses.dataclass(frozen=True)
class Encoded:
  """A chunk's documents tokenized: tokens back to back, each document followed by EOS."""

  tokens: np.ndarray  # The store's dtype [sum(lengths)].
  lengths: np.ndarray  # int64 [docs], EOS included.
  hashes: np.ndarray  # uint64 [docs]: blake2b of each document's text (SFT: prompt \0 text).
  prompt_lengths: np.ndarray  # int32 [docs]: prompt tokens (0 without a prompt).


@dataclasses.dataclass
class Chunk:
  """Documents on their way to the encoder, and what the store keeps of them besides."""

  texts: list[str] = dataclasses.field(default_factory=list)
  prompts: list[str] | None = None
  files: list[int] = dataclasses.field(default_factory=list)
  clients: list[str | None] = dataclasses.field(default_factory=list)
  chars: int = 0


def text_hashes(texts: list[str], prompts: list[str] | None) -> np.ndarray:
  """uint64 [docs]: the 64-bit blake2b of each document (SFT: prompt \\0 completion), which
  places it in the held-out split or not."""
  data = texts if prompts is None else [f'{p}\0{t}' for p, t in zip(prompts, texts)]
  digests = b''.join(hashlib.blake2b(d.encode('utf-8', 'surrogatepass'), digest_size=8).digest()
                     for d in data)
  return np.frombuffer(digests, '<u8').astype(np.uint64)


def text_hash(text: str, prompt: str | None) -> int:
  """The hash of one document (text_hashes)."""
  return int(text_hashes([text], None if prompt is None else [prompt])[0])


def encode_chunk(tokenizer: Any, dtype: np.dtype, texts: list[str],
                 prompts: list[str] | None) -> Encoded:
  """Each text (after its prompt) tokenized, followed by the tokenizer's EOS."""
  ids = tokenizer.encode_batch(texts)
  prompt_ids = tokenizer.encode_batch(prompts) if prompts is not None else None
  prompt_lengths = np.array([len(p) for p in prompt_ids] if prompt_ids else [0] * len(ids),
                            np.int32)
  lengths = np.array([len(a) + 1 for a in ids], np.int64) + prompt_lengths
  ends = np.cumsum(lengths)
  tokens = np.empty(int(ends[-1]) if len(ends) else 0, dtype)
  body = np.ones(len(tokens), bool)
  body[ends - 1] = False
  tokens[~body] = tokenizer.eos_id
  if prompt_ids is not None:
    ids = [x for pair in zip(prompt_ids, ids) for x in pair]
  if ids:
    tokens[body] = np.concatenate(ids)
  return Encoded(tokens, lengths, text_hashes(texts, prompts), prompt_lengths)


_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer: Any, dtype: np.dtype) -> None:
  _WORKER.update(tokenizer=tokenizer, dtype=dtype)


def _encode_in_worker(texts: list[str], prompts: list[str] | None) -> Encoded:
  return encode_chunk(_WORKER['tokenizer'], _WORKER['dtype'], texts, prompts)


def chunks(files: dict[str, Path], fields: text_files.Fields,
           counts: text_files.Counts) -> Iterator[Chunk]:
  """The corpus's documents, file after file, in chunks of at least CHUNK_CHARS characters
  or CHUNK_DOCS documents (whole blocks of text_files.read)."""
  sft = fields.prompt_field is not None
  chunk = Chunk(prompts=[] if sft else None)
  for index, path in enumerate(files.values()):
    for block in text_files.read(path, fields, counts):
      chunk.texts += block.texts
      if sft:
        chunk.prompts += block.prompts
      chunk.files += [index] * len(block.texts)
      chunk.clients += block.clients or [None] * len(block.texts)
      chunk.chars += sum(map(len, block.texts)) + sum(map(len, block.prompts or ()))
      if chunk.chars >= CHUNK_CHARS or len(chunk.texts) >= CHUNK_DOCS:
        yield chunk
        chunk = Chunk(prompts=[] if sft else None)
  if chunk.texts:
    yield chunk


def encoded_chunks(files: dict[str, Path], fields: text_files.Fields,
                   counts: text_files.Counts, tokenizer: Any, dtype: np.dtype,
                   num_workers: int) -> Iterator[tuple[Chunk, Encoded]]:
  """Each chunk (texts dropped) with its encoding into `dtype` ids, in corpus order: encoded
  here (num_workers <= 1), by `num_workers` threads (a corpus under POOL_MIN_BYTES), else by
  `num_workers` spawned processes; see the module docstring."""
  source = chunks(files, fields, counts)
  if num_workers <= 1:
    for chunk in source:
      yield _without_text(chunk), encode_chunk(tokenizer, dtype, chunk.texts, chunk.prompts)
    return
  if sum(p.stat().st_size for p in files.values()) < POOL_MIN_BYTES:
    executor = concurrent.futures.ThreadPoolExecutor(num_workers, 'tokenize')
    encode = functools.partial(encode_chunk, tokenizer, dtype)
  else:
    executor = concurrent.futures.ProcessPoolExecutor(
        num_workers, multiprocessing.get_context('spawn'), _init_worker, (tokenizer, dtype))
    encode = _encode_in_worker
  with executor:
    pending: collections.deque = collections.deque()
    for chunk in source:
      pending.append((_without_text(chunk), executor.submit(encode, chunk.texts, chunk.prompts)))
      if len(pending) >= 2 * num_workers:
        done, result = pending.popleft()
        yield done, result.result()
    while pending:
      done, result = pending.popleft()
      yield done, result.result()


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
