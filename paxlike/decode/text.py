"""Text in, text out: `generate` behind a tokenizer (see `paxlike.tokenizers`)."""

from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn

from paxlike.decode.engine import generate
from paxlike.errors import UserError


def check_vocab(model: nn.Module, tokenizer: Any) -> None:
  """UserError when the tokenizer emits ids the model has no embedding for."""
  if tokenizer.vocab_size > model.vocab_size:
    raise UserError(f'the tokenizer has {tokenizer.vocab_size} ids but the model\'s vocab_size '
                    f'is {model.vocab_size}')


def check_prompts(model: nn.Module, tokenizer: Any, prompts: Sequence[str]) -> None:
  """UserError for a tokenizer the model cannot embed, or an empty prompt."""
  check_vocab(model, tokenizer)
  if any(not prompt for prompt in prompts):
    raise UserError('a prompt is empty')


def continuations(tokenizer: Any, rows: Sequence[Any], eos_id: int | None) -> list[str]:
  """Each generated row as text, without the EOS it stopped at."""
  strip = lambda row: row[:-1] if eos_id is not None and len(row) and row[-1] == eos_id else row
  return [tokenizer.decode(strip(row).tolist()) for row in rows]


def generate_text(model: nn.Module, params: Any, tokenizer: Any, prompts: Sequence[str], *,
                  stop_at_eos: bool = True, **options: Any) -> list[str]:
  """The continuation of each prompt (without the prompt, and without the EOS it stopped at).

  `options` are `generate`'s (max_new_tokens, temperature, top_k, top_p, seed, cache_len, mesh,
  rules); EOS is the tokenizer's unless `stop_at_eos` is False, and padding its pad id.
  """
  check_prompts(model, tokenizer, prompts)
  eos_id = tokenizer.eos_id if stop_at_eos else None
  rows = generate(model, params, tokenizer.encode_batch(list(prompts)), eos_id=eos_id,
                  pad_id=tokenizer.pad_id, **options)
  return continuations(tokenizer, rows, eos_id)
