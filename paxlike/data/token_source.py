"""`TokenSource`: the part of the text sources (TextData, PreferenceData) that reads a user's
files through a tokenizer into a token store."""

import abc
import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from paxlike.data import sources
from paxlike.data import token_store


def globs_of(files: str | Sequence[str]) -> list[str]:
  """`files` (a glob or a list of globs) as a list."""
  return [files] if isinstance(files, str) else list(files)


class TokenizedSource(sources.DataSource):
  """A source whose `tokenizer` field names a tokenizer ('bytes' or a path,
  paxlike.tokenizers.load_tokenizer): the job dir keeps a copy of it (trainer/job_source.py)."""

  tokenizer: str

  @functools.cached_property
  def loaded_tokenizer(self) -> Any:
    """The tokenizer named by `tokenizer`."""
    from paxlike.tokenizers import load_tokenizer  # pylint: disable=import-outside-toplevel
    return load_tokenizer(self.tokenizer)

  @property
  def vocab_size(self) -> int:
    """The tokenizer's vocabulary (the model rounds it up)."""
    return self.loaded_tokenizer.vocab_size


class TokenSource(TokenizedSource):
  """A tokenized source whose documents live in a token store."""

  files: str | Sequence[str]
  num_workers: int | None
  seq_len: int
  DATASET = 'text'  # What `fingerprint()` calls the data.
  CACHED = ('store',)  # Cached properties a pickled copy recomputes instead of carrying.

  def __getstate__(self) -> dict[str, Any]:
    """The fields and the tokenizer: a copy (a loader worker's) reopens the store's memory maps
    instead of pickling their contents."""
    return {k: v for k, v in self.__dict__.items() if k not in self.CACHED}

  def open_store(self, files: list[Path], fields: Any, chat: bool) -> token_store.Store:
    """The token store of `files` read with `fields` (built the first time, by any run); chat
    rows are rendered with the tokenizer's chat template."""
    encoder = self.loaded_tokenizer
    if chat:
      from paxlike.tokenizers.chat_encoder import load_chat_encoder  # pylint: disable=import-outside-toplevel
      encoder = load_chat_encoder(encoder)
    return token_store.open_or_build(files, fields, encoder, self.num_workers or os.cpu_count())

  @property
  @abc.abstractmethod
  def store(self) -> token_store.Store:
    """The token store the batches read."""

  def fingerprint(self) -> dict[str, str]:
    """The store's key: what the files held, read with this tokenizer and these fields."""
    return {'dataset': self.DATASET, 'sha256': self.store.manifest['key'],
            'source': f'{", ".join(globs_of(self.files))} (tokenizer {self.tokenizer})'}

  def row_spec(self) -> dict[str, sources.Spec]:
    """A packed row: int32 inputs, targets, segment_ids and positions, float32 mask."""
    ints, floats = sources.Spec((self.seq_len,), np.dtype(np.int32)), sources.Spec(
        (self.seq_len,), np.dtype(np.float32))
    return {'inputs': ints, 'targets': ints, 'segment_ids': ints, 'positions': ints,
            'mask': floats}
