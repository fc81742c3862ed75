"""Hugging Face `tokenizer.json` files (Llama 3-style checkpoints, `python -m paxlike.tokenizers
train --kind=bpe`), with the special tokens a sibling `tokenizer_config.json` names."""

from __future__ import annotations

import itertools
import json
import operator
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import tokenizers

from paxlike.errors import UserError
from paxlike.tokenizers.common import (decodable_ids, fingerprint, flat_ids, int32_ids,
                                       read_tokenizer_file)

# Where special tokens are named, the first file winning (HF checkpoint dirs hold both).
CONFIG_FILES = ('tokenizer_config.json', 'special_tokens_map.json')
# Tokens tried, in order, for a role no config file names.
TOKEN_NAMES = {
    'eos_token': ('</s>', '<|endoftext|>', '<|end_of_text|>', '<eos>', '<|eos|>'),
    'bos_token': ('<s>', '<|begin_of_text|>', '<bos>', '<|startoftext|>'),
    'pad_token': ('<pad>', '<|pad|>', '[PAD]', '<|padding|>'),
}


def configured_tokens(directory: Path) -> dict[str, tuple[str, str]]:
  """role ('eos_token', 'bos_token', 'pad_token') -> (token, config file name) for the roles
  the config files in `directory` name (a null role counts as not named)."""
  found: dict[str, tuple[str, str]] = {}
  for name in reversed(CONFIG_FILES):
    file = directory / name
    if not file.is_file():
      continue
    try:
      config = json.loads(file.read_text('utf-8'))
    except (OSError, ValueError) as error:
      raise UserError(f'tokenizer config {file}: not a readable JSON file ({error})') from None
    for role in TOKEN_NAMES:
      value = config.get(role) if isinstance(config, dict) else None
      value = value.get('content') if isinstance(value, dict) else value
      if isinstance(value, str):
        found[role] = (value, name)
  return found


def config_flag(directory: Path, name: str) -> bool | None:
  """A boolean setting of `directory`'s tokenizer_config.json (e.g. add_bos_token), None when it
  names none."""
  file = directory / CONFIG_FILES[0]
  try:
    config = json.loads(file.read_text('utf-8')) if file.is_file() else {}
  except (OSError, ValueError) as error:
    raise UserError(f'tokenizer config {file}: not a readable JSON file ({error})') from None
  value = config.get(name) if isinstance(config, dict) else None
  return value if isinstance(value, bool) else None


def _prefix_ids(tok: tokenizers.Tokenizer) -> tuple[int, ...]:
  """The ids the tokenizer's post-processor puts before a text encoded with its special tokens
  (transformers' `tokenizer(text)`): Llama 3's <|begin_of_text|>, nothing for most others."""
  plain = tok.encode('a', add_special_tokens=False).ids
  full = tok.encode('a', add_special_tokens=True).ids
  for start in range(len(full) - len(plain) + 1):
    if full[start:start + len(plain)] == plain:
      return tuple(full[:start])
  return ()


def _parse(path: Path, data: bytes) -> tuple[tokenizers.Tokenizer, int | None]:
  """The tokenizer serialized in `data`, and the pad id of its padding setting if any. It
  encodes text as text: special tokens' strings in a document are not turned into special ids,
  and nothing is truncated or padded."""
  try:
    tok = tokenizers.Tokenizer.from_str(data.decode('utf-8'))
  except Exception as error:  # tokenizers raises plain Exception for a bad file.
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    raise UserError(f'tokenizer {path}: not a Hugging Face tokenizer.json ({reason})') from None
  pad_id = (tok.padding or {}).get('pad_id')
  tok.encode_special_tokens = True
  tok.no_truncation()
  tok.no_padding()
  return tok, pad_id


def _special_id(tok: tokenizers.Tokenizer, role: str, configured: dict[str, tuple[str, str]],
                path: Path) -> int | None:
  """The id of `role`'s token: the one a config file names, else the first of TOKEN_NAMES."""
  if role in configured:
    token, source = configured[role]
    if (token_id := tok.token_to_id(token)) is None:
      raise UserError(f'tokenizer {path}: {source} names {role} {token!r}, '
                      'which the tokenizer does not have')
    return token_id
  return next((tok.token_to_id(name) for name in TOKEN_NAMES[role]
               if tok.token_to_id(name) is not None), None)


class HfTokenizer:
  """A Hugging Face `tokenizers` tokenizer. Like SentencePieceTokenizer it keeps the file's
  bytes, rebuilding the library object when unpickled (whose own pickling drops settings).

  eos must be found (a config's eos_token, else a usual name such as </s> or <|endoftext|>);
  pad is the config's pad_token, else the file's padding id, else a usual name, else eos.
  """

  kind = 'hf'

  def __init__(self, path: str | Path):
    self.path = str(path)
    self._data = read_tokenizer_file(Path(path))
    self.fingerprint = fingerprint(self._data)
    self._tok, file_pad_id = _parse(Path(path), self._data)
    self._markup_tok: tokenizers.Tokenizer | None = None  # encode_markup's, made on first use.
    self._init_ids(Path(path), file_pad_id)

  def _init_ids(self, path: Path, file_pad_id: int | None) -> None:
    configured = configured_tokens(path.parent)
    vocab = self._tok.get_vocab(with_added_tokens=True)
    self.vocab_size = max(vocab.values(), default=-1) + 1
    eos_id = _special_id(self._tok, 'eos_token', configured, path)
    if eos_id is None:
      raise UserError(f'tokenizer {path}: no eos token found (tried {", ".join(CONFIG_FILES)} '
                      f'eos_token and {" ".join(TOKEN_NAMES["eos_token"])}); paxlike needs one')
    self.eos_id: int = eos_id
    self.bos_id = _special_id(self._tok, 'bos_token', configured, path)
    pad_id = _special_id(self._tok, 'pad_token', configured, path)
    if 'pad_token' not in configured and file_pad_id is not None:
      pad_id = file_pad_id
    self.pad_id: int = self.eos_id if pad_id is None else pad_id
    # What transformers' tokenizer(text) puts first: tokenizer_config.json's add_bos_token when
    # it says (it rewrites the post-processor there), else the post-processor's own prefix.
    add_bos = config_flag(path.parent, 'add_bos_token')
    if add_bos is None:
      self.bos_prefix: tuple[int, ...] = _prefix_ids(self._tok)
    else:
      self.bos_prefix = (self.bos_id,) if add_bos and self.bos_id is not None else ()

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
    return [int32_ids(encoding.ids) for encoding in encodings]

  def encode_flat(self, texts: Sequence[str], num_threads: int | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """encode_batch's ids back to back, by encode_batch_fast (the same ids, no offsets), on
    the library's one pool (num_threads is not per call there)."""
    encodings = self._tok.encode_batch_fast(list(texts), add_special_tokens=False)
    return flat_ids(list(map(operator.attrgetter('ids'), encodings)))

  def decode(self, ids: Sequence[int]) -> str:
    kept = decodable_ids(ids, self.pad_id, self.vocab_size)
    return self._tok.decode(kept, skip_special_tokens=False)

  def encode_markup(self, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(int32 ids, int64 [n, 2] character offsets) of each text as transformers' tokenizer
    encodes a rendered chat template (`add_special_tokens=False`): each special token's string
    (e.g. <|im_start|>) is its one id, and no bos/eos is added. Not for documents, whose text
    may spell a special token by chance (encode_batch keeps it text)."""
    if self._markup_tok is None:
      self._markup_tok, _ = _parse(Path(self.path), self._data)
      self._markup_tok.encode_special_tokens = False
    encodings = self._markup_tok.encode_batch(list(texts), add_special_tokens=False)
    return [(int32_ids(e.ids), np.fromiter(itertools.chain.from_iterable(e.offsets), np.int64,
                                          2 * len(e.offsets)).reshape(-1, 2))
            for e in encodings]

  @property
  def added_ids(self) -> frozenset[int]:
    """The ids of the tokenizer's added tokens (special or not: a chat template's role and turn
    markers are among them; encode_markup gives each its one id)."""
    return frozenset(self._tok.get_added_tokens_decoder())

  def __getstate__(self) -> dict[str, Any]:
    return {k: (None if k == '_markup_tok' else v) for k, v in self.__dict__.items()
            if k != '_tok'}

  def __setstate__(self, state: dict[str, Any]) -> None:
    self.__dict__.update(state)
    self._tok, _ = _parse(Path(self.path), self._data)

  def __repr__(self) -> str:
    return f'HfTokenizer({self.path!r}, vocab_size={self.vocab_size})'
