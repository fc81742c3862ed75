"""Training a tokenizer on text: a SentencePiece BPE `tokenizer.model` or a Hugging Face
byte-level BPE `tokenizer.json` (with its `tokenizer_config.json`), written atomically.

The vocab asked for is the vocab written: a corpus too small for it is a UserError saying how
large it may be (SentencePiece's hard_vocab_limit stays on, and the HF trainer is held to the
same rule), so a model sized for N ids never silently gets fewer.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Iterable, Iterator

import sentencepiece as spm
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from paxlike.core import files
from paxlike.errors import RunFailure, UserError

FILE_NAMES = {'sentencepiece': 'tokenizer.model', 'bpe': 'tokenizer.json'}
SP_SPECIAL_IDS = {'pad_id': 0, 'unk_id': 1, 'bos_id': 2, 'eos_id': 3}
BPE_PAD, BPE_EOS = '<pad>', '<|endoftext|>'  # ids 0 and 1
BPE_MIN_VOCAB = 256 + 2  # every byte, and the two special tokens
SP_OPTIONS = {
    'model_type': 'bpe', 'byte_fallback': True, 'minloglevel': 2,
    # Text comes back exactly: no NFKC, no collapsing of spaces.
    'normalization_rule_name': 'identity', 'remove_extra_whitespaces': False,
    # Lines are the sentences; longer ones (bytes) are left out of training, and a corpus of more
    # lines is sampled down to this many (SentencePiece's advice), bounding memory.
    'max_sentence_length': 1 << 14, 'input_sentence_size': 10_000_000,
    'shuffle_input_sentence': True,
}


class _Text:
  """Texts passed through once, remembering whether any had a non-space character and the
  reading error that stopped them (SentencePiece wraps an iterator's error in RuntimeError)."""

  def __init__(self, texts: Iterable[str]):
    self.texts, self.any_text, self.error = texts, False, None

  def __iter__(self) -> Iterator[str]:
    try:
      for text in self.texts:
        self.any_text = self.any_text or (bool(text) and not text.isspace())
        yield text
    except (UserError, RunFailure) as error:
      self.error = error
      raise

  def check(self) -> None:
    if self.error is not None:
      raise self.error
    if not self.any_text:
      raise UserError('--files hold no text to train on')


def sentencepiece_model(texts: Iterable[str], vocab_size: int) -> bytes:
  """A SentencePiece BPE model's bytes (pad 0, unk 1, bos 2, eos 3, byte fallback)."""
  source, writer = _Text(texts), io.BytesIO()
  lines = (line for text in source for line in text.splitlines() if line)
  spm.set_random_generator_seed(0)  # The same corpus gives the same model, sampled or not.
  try:
    spm.SentencePieceTrainer.train(sentence_iterator=lines, model_writer=writer,
                                   vocab_size=vocab_size, **SP_OPTIONS, **SP_SPECIAL_IDS)
  except RuntimeError as error:
    source.check()
    raise _sentencepiece_error(str(error), vocab_size) from None
  source.check()
  return writer.getvalue()


def _sentencepiece_error(message: str, vocab_size: int) -> Exception:
  if limit := re.search(r'Vocabulary size too high .*<= (\d+)', message):
    return UserError(f'--vocab_size={vocab_size} is more than this corpus allows for a '
                     f'SentencePiece BPE model (at most {limit[1]}); lower --vocab_size')
  if need := re.search(r'smaller than required_chars\. \d+ vs (\d+)', message):
    return UserError(f'--vocab_size={vocab_size} is below the {need[1]} pieces this corpus needs '
                     '(its characters, 256 bytes, 4 special tokens); raise --vocab_size')
  return RunFailure(f'sentencepiece training failed: {message.splitlines()[0]}')


def bpe_tokenizer(texts: Iterable[str], vocab_size: int) -> tokenizers.Tokenizer:
  """A Hugging Face byte-level BPE tokenizer (pad 0 '<pad>', eos 1 '<|endoftext|>')."""
  if vocab_size < BPE_MIN_VOCAB:
    raise UserError(f'--vocab_size={vocab_size} is below {BPE_MIN_VOCAB} '
                    '(256 bytes and 2 special tokens) for --kind=bpe')
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BPE_PAD, BPE_EOS],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  source = _Text(texts)
  tok.train_from_iterator((chunk for text in source for chunk in _chunks(text)), trainer=trainer)
  source.check()
  if tok.get_vocab_size() < vocab_size:
    raise UserError(f'--vocab_size={vocab_size} is more than this corpus allows for a BPE '
                    f'tokenizer (at most {tok.get_vocab_size()}); lower --vocab_size')
  return tok


def _chunks(text: str, size: int = 1 << 16) -> Iterator[str]:
  """`text` in pieces of about `size` characters, cut after a newline where there is one."""
  start = 0
  while start < len(text):
    cut = text.find('\n', start + size)
    end = len(text) if cut < 0 else cut + 1
    yield text[start:end]
    start = end


def bpe_config() -> dict[str, object]:
  """The tokenizer_config.json written beside a trained tokenizer.json (transformers reads it
  too: PreTrainedTokenizerFast, no bos, no clean-up of spaces)."""
  return {'tokenizer_class': 'PreTrainedTokenizerFast', 'eos_token': BPE_EOS,
          'pad_token': BPE_PAD, 'bos_token': None, 'clean_up_tokenization_spaces': False}


def write_tokenizer(kind: str, texts: Iterable[str], vocab_size: int, out: Path) -> Path:
  """Trains a `kind` tokenizer on `texts` and writes it into the directory `out`; its path.
  For 'bpe' the config goes first, so a tokenizer.json is never without it."""
  if kind == 'sentencepiece':
    data = sentencepiece_model(texts, vocab_size)
  else:
    data = bpe_tokenizer(texts, vocab_size).to_str(pretty=True).encode('utf-8')
  out.mkdir(parents=True, exist_ok=True)
  if kind == 'bpe':
    config = json.dumps(bpe_config(), indent=2) + '\n'
    files.write_text(out / 'tokenizer_config.json', config)
  files.write_bytes(out / FILE_NAMES[kind], data)
  return out / FILE_NAMES[kind]
