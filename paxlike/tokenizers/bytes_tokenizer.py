"""The byte-level tokenizer: UTF-8 bytes are the ids (what paxlike's byte LMs have always used)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from paxlike.tokenizers.common import decodable_ids


class BytesTokenizer:
  """Ids 0..255 are UTF-8 bytes; '\\n' (10) separates documents, as in today's byte corpora.

  pad is 0 (NUL), so `decode` drops NUL bytes; bytes that are not valid UTF-8 decode to U+FFFD.
  """

  kind = 'bytes'
  vocab_size = 256
  bos_id = None
  bos_prefix: tuple[int, ...] = ()
  eos_id = ord('\n')
  pad_id = 0
  fingerprint = 'bytes'
  path = None

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    return [np.frombuffer(text.encode('utf-8'), np.uint8).astype(np.int32) for text in texts]

  def encode_flat(self, texts: Sequence[str], num_threads: int | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    joined = ''.join(texts)
    sizes = map(len, texts if joined.isascii() else map(str.encode, texts))
    return (np.frombuffer(joined.encode('utf-8'), np.uint8).astype(np.int32),
            np.fromiter(sizes, np.int64, len(texts)))

  def decode(self, ids: Sequence[int]) -> str:
    kept = decodable_ids(ids, self.pad_id, self.vocab_size)
    return bytes(kept).decode('utf-8', errors='replace')

  def __repr__(self) -> str:
    return 'BytesTokenizer()'
