"""Documents into one token array, each tokenized and followed by EOS: the encoding the token
store's build (paxlike/data/token_build.py) runs, in its worker processes too. Those import
this module alone, not paxlike.data, so they start sooner.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from paxlike.errors import UserError

Pieces = list[tuple[np.ndarray, np.ndarray]]


class DocumentRefused(UserError):
  """Document `index` of an encode call is refused (`message`); the token store's build names
  its file and line (token_build). Pickles across the build's worker processes."""

  def __init__(self, message: str, index: int):
    super().__init__(message)
    self.message, self.index = message, index

  def __reduce__(self) -> tuple[Any, ...]:
    return type(self), (self.message, self.index)


def join_documents(pieces: Pieces, eos_id: int, dtype: np.dtype
                   ) -> tuple[np.ndarray, np.ndarray]:
  """(tokens in `dtype`, int64 lengths): document i is each piece's ids of i in turn, then
  `eos_id`; a piece is (ids back to back, their count per document), as
  Tokenizer.encode_flat returns them. One piece is placed by a mask (cheaper than a scatter's
  index arithmetic: docs/benchmarks.md, "EOS placement"), several first interleaved by one
  scatter each."""
  ids, counts = pieces[0] if len(pieces) == 1 else interleave(pieces)
  lengths = counts + 1
  ends = np.cumsum(lengths)
  tokens = np.empty(int(ends[-1]) if len(ends) else 0, dtype)
  body = np.ones(len(tokens), bool)
  body[ends - 1] = False
  tokens[body] = ids
  tokens[ends - 1] = eos_id
  return tokens, lengths


def interleave(pieces: Pieces) -> tuple[np.ndarray, np.ndarray]:
  """One piece whose document i is each piece's ids of i in turn."""
  counts = sum(c for _, c in pieces)
  ends = np.cumsum(counts)
  out = np.empty(int(ends[-1]) if len(ends) else 0, pieces[0][0].dtype)
  first = ends - counts  # Where each document's next piece goes.
  for ids, n in pieces:
    out[np.arange(len(ids)) + np.repeat(first - (np.cumsum(n) - n), n)] = ids
    first = first + n
  return out, counts


def encode_documents(tokenizer: Any, dtype: np.dtype, num_threads: int | None, texts: list[str],
                     prompts: list[str] | None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
  """(tokens, lengths, prompt_lengths, trained): each text tokenized, the library using
  `num_threads` (Tokenizer.encode_flat), then the tokenizer's EOS; lengths count the EOS,
  trained is None. With prompts, as TRL: the tokenizer's BOS rule (bos_prefix) first, then
  prompt + text tokenized whole, its prompt the ids it shares with the prompt tokenized alone
  (common_prefix_lengths), counted in prompt_lengths (int32; 0 without prompts). A ChatEncoder (chat_encoder.py) instead encodes each text as a
  conversation (JSON messages), with `trained` marking its assistant tokens."""
  if hasattr(tokenizer, 'encode_conversations'):
    return tokenizer.encode_conversations(texts, dtype)
  if prompts is None:
    tokens, lengths = join_documents([tokenizer.encode_flat(texts, num_threads)],
                                     tokenizer.eos_id, dtype)
    return tokens, lengths, np.zeros(len(texts), np.int32), None
  prompt_ids, prompt_counts = tokenizer.encode_flat(prompts, num_threads)
  joined = tokenizer.encode_flat([p + t for p, t in zip(prompts, texts)], num_threads)
  prompt_lengths = common_prefix_lengths(prompt_ids, prompt_counts, *joined)
  pieces = [joined]
  prefix = np.asarray(getattr(tokenizer, 'bos_prefix', ()), np.int32)
  if len(prefix):  # The tokenizer's own BOS rule (Tokenizer.bos_prefix), before the prompt.
    pieces.insert(0, (np.tile(prefix, len(texts)), np.full(len(texts), len(prefix), np.int64)))
    prompt_lengths = prompt_lengths + len(prefix)
  tokens, lengths = join_documents(pieces, tokenizer.eos_id, dtype)
  return tokens, lengths, prompt_lengths.astype(np.int32), None


def common_prefix_lengths(a: np.ndarray, a_counts: np.ndarray, b: np.ndarray,
                          b_counts: np.ndarray) -> np.ndarray:
  """int64 [docs]: how many ids document i of `a` and of `b` (flat ids and counts per document,
  as encode_flat gives) begin with alike. With `a` the prompts and `b` the prompts + their
  completions tokenized whole, it is TRL's prompt: a token that merges across the boundary
  belongs to the completion."""
  a_counts, b_counts = np.asarray(a_counts, np.int64), np.asarray(b_counts, np.int64)
  doc = np.repeat(np.arange(len(a_counts)), a_counts)
  j = np.arange(len(a)) - np.repeat(np.cumsum(a_counts) - a_counts, a_counts)
  inside = j < b_counts[doc]
  at = np.where(inside, (np.cumsum(b_counts) - b_counts)[doc] + j, 0)
  differs = ~inside
  if len(b):
    differs |= np.asarray(a) != np.asarray(b)[at]
  first = a_counts.copy()
  np.minimum.at(first, doc[differs], j[differs])
  return first


_WORKER: dict[str, Any] = {}


def init_worker(tokenizer: Any, dtype: np.dtype, num_threads: int | None) -> None:
  """A worker process's initializer: the tokenizer, dtype and library threads its calls use."""
  _WORKER.update(tokenizer=tokenizer, dtype=dtype, num_threads=num_threads)


def encode_in_worker(texts: list[str], prompts: list[str] | None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
  """encode_documents with the worker's tokenizer (init_worker)."""
  return encode_documents(_WORKER['tokenizer'], _WORKER['dtype'], _WORKER['num_threads'], texts,
                          prompts)
