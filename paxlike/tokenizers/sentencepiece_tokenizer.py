"""SentencePiece `*.model` files (Llama 1/2-style checkpoints, `python -m paxlike.tokenizers
train --kind=sentencepiece`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import sentencepiece as spm

from paxlike.errors import UserError
from paxlike.tokenizers.common import (decodable_ids, fingerprint, flat_ids, int32_ids,
                                       read_tokenizer_file)


def _processor(path: Path, data: bytes) -> spm.SentencePieceProcessor:
  """The processor of the serialized model `data` (read from `path`)."""
  try:
    processor = spm.SentencePieceProcessor(model_proto=data)
  except RuntimeError:
    processor = None
  if processor is None or processor.get_piece_size() == 0:
    raise UserError(f'tokenizer {path}: not a SentencePiece model (it does not parse as one)')
  return processor


class SentencePieceTokenizer:
  """A SentencePiece model. It keeps the file's bytes, so a pickled copy (a data worker's) is
  the same model even if the file changes later; the processor is rebuilt on unpickling.

  bos/eos/pad are the model's own ids; a model without pad (-1) pads with eos, which decodes
  to nothing anyway. Text never encodes to these control ids.
  """

  kind = 'sentencepiece'

  def __init__(self, path: str | Path):
    self.path = str(path)
    self._data = read_tokenizer_file(Path(path))
    self.fingerprint = fingerprint(self._data)
    self._sp = _processor(Path(path), self._data)
    self.vocab_size = self._sp.get_piece_size()
    if self._sp.eos_id() < 0:
      raise UserError(f'tokenizer {path}: the SentencePiece model has no eos token (eos_id -1); '
                      'paxlike needs one to separate documents')
    self.eos_id = self._sp.eos_id()
    self.bos_id = self._sp.bos_id() if self._sp.bos_id() >= 0 else None
    self.pad_id = self._sp.pad_id() if self._sp.pad_id() >= 0 else self.eos_id
    # BOS first where the checkpoint's tokenizer_config.json says add_bos_token (Llama 1/2's);
    # a bare .model names no rule, and gets none.
    from paxlike.tokenizers.hf_tokenizer import config_flag  # pylint: disable=import-outside-toplevel
    add_bos = config_flag(Path(path).parent, 'add_bos_token')
    self.bos_prefix: tuple[int, ...] = (
        (self.bos_id,) if add_bos and self.bos_id is not None else ())

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    return [int32_ids(ids) for ids in self._sp.encode(list(texts), out_type=int)]

  def encode_flat(self, texts: Sequence[str], num_threads: int | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    return flat_ids(self._sp.encode(list(texts), out_type=int,
                                    num_threads=-1 if num_threads is None else num_threads))

  def decode(self, ids: Sequence[int]) -> str:
    return self._sp.decode(decodable_ids(ids, self.pad_id, self.vocab_size))

  def __getstate__(self) -> dict[str, Any]:
    return {k: v for k, v in self.__dict__.items() if k != '_sp'}

  def __setstate__(self, state: dict[str, Any]) -> None:
    self.__dict__.update(state)
    self._sp = _processor(Path(self.path), self._data)

  def __repr__(self) -> str:
    return f'SentencePieceTokenizer({self.path!r}, vocab_size={self.vocab_size})'
