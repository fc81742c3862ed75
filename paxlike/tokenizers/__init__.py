"""Tokenizers behind one interface: bytes, SentencePiece (`*.model`), Hugging Face
(`tokenizer.json`).

  tok = load_tokenizer('bytes' | 'DIR/tokenizer.model' | 'DIR/tokenizer.json' | 'DIR')
  ids = tok.encode_batch(['some text', ...])   # int32 arrays, no bos/eos added
  flat, lengths = tok.encode_flat([...])      # the same ids back to back, and their counts
  text = tok.decode(ids)                       # skips pad; the caller cuts at eos
  model_vocab = vocab_for_model(tok.vocab_size)

Train one with `python -m paxlike.tokenizers train --files=GLOB --vocab_size=N
--kind=sentencepiece|bpe --out=DIR` (paxlike/tokenizers/__main__.py).

Chat: `chat_template.load_chat_template(path)` is the chat template beside a tokenizer, rendered
as transformers renders it; `chat_encoder.load_chat_encoder(tok)` turns conversations into ids
(special tokens one id each) and the mask of the assistant's tokens.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from paxlike.errors import UserError
from paxlike.tokenizers.bytes_tokenizer import BytesTokenizer
from paxlike.tokenizers.hf_tokenizer import HfTokenizer
from paxlike.tokenizers.sentencepiece_tokenizer import SentencePieceTokenizer

__all__ = ['Tokenizer', 'load_tokenizer', 'vocab_for_model', 'BytesTokenizer', 'HfTokenizer',
           'SentencePieceTokenizer']

# The files a checkpoint directory may hold, the first found winning.
DIR_FILES = ('tokenizer.json', 'tokenizer.model')


@runtime_checkable
class Tokenizer(Protocol):
  """What the data pipeline and decoding use. Implementations pickle (data workers encode)."""

  kind: str  # 'bytes', 'sentencepiece' or 'hf'
  vocab_size: int  # ids the tokenizer can emit (max id + 1)
  bos_id: int | None
  # The ids the tokenizer's own rule (add_bos_token, or its post-processor) puts before a text
  # that is a row of its own: a prompt, a prompt + completion (TRL's tokenizer(text)); () none.
  bos_prefix: tuple[int, ...]
  eos_id: int  # the document separator; every tokenizer has one
  pad_id: int  # the id used for padding (masked out of the loss)
  fingerprint: str  # sha256 hex of the tokenizer file's bytes; 'bytes' for the byte tokenizer
  path: str | None  # the file it was loaded from

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    """int32 ids of each text; no bos/eos added, special tokens' strings encode as text."""
    ...

  def encode_flat(self, texts: Sequence[str], num_threads: int | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(int32 [total], int64 [len(texts)]): encode_batch's ids back to back and each text's
    count, made without an array per text (what the token store's build uses). `num_threads`:
    the library's threads for this call (None: every core); SentencePiece takes it, Hugging
    Face's calls share one pool of every core (rayon's) and bytes are numpy on one thread."""
    ...

  def decode(self, ids: Sequence[int]) -> str:
    """The text of `ids`, skipping pad and ids outside the vocab; it does not stop at eos."""
    ...


def load_tokenizer(spec: str | os.PathLike) -> Tokenizer:
  """'bytes', a SentencePiece `*.model`, a Hugging Face `*.json` (its directory's
  tokenizer_config.json naming the special tokens), or a directory holding tokenizer.json or
  tokenizer.model (tokenizer.json preferred). Anything else is a UserError naming it."""
  if os.fspath(spec) == 'bytes':
    return BytesTokenizer()
  path = Path(spec).expanduser()
  if path.is_dir():
    found = [path / name for name in DIR_FILES if (path / name).is_file()]
    if not found:
      raise UserError(f'tokenizer directory {path}: holds neither {" nor ".join(DIR_FILES)}')
    path = found[0]
  elif not path.exists():
    raise UserError(f'tokenizer {path}: no such file or directory')
  if path.suffix == '.json':
    return HfTokenizer(path)
  if path.suffix == '.model':
    return SentencePieceTokenizer(path)
  raise UserError(f"tokenizer {path}: not a tokenizer (expected 'bytes', a SentencePiece "
                  '*.model, a Hugging Face tokenizer.json, or a directory holding one)')


def vocab_for_model(tokenizer_vocab: int, multiple: int = 128) -> int:
  """The model's vocab_size for a tokenizer's: rounded up to a multiple of `multiple` (128 keeps
  the embedding and logits shardable and their matmuls aligned)."""
  if tokenizer_vocab < 1 or multiple < 1:
    raise ValueError(f'vocab_for_model({tokenizer_vocab}, {multiple}): both must be positive')
  return -(-tokenizer_vocab // multiple) * multiple
