"""Prompt rows for GRPO (`PromptData`): JSONL rows with a `prompt` string, or chat `messages`
(the prompt is the conversation so far, rendered by the tokenizer's chat template with its
generation prompt), an optional `answer`, and any other fields, which reward functions may
read. Read whole into memory: prompt sets are small (GSM8K's train split is 7,473 rows)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from paxlike.data import chat_rows
from paxlike.data import text_files
from paxlike.errors import UserError


@dataclasses.dataclass(frozen=True)
class PromptRows:
  """The rows kept, in file order: prompt text and ids, answer text ('' where none), every
  row's fields (for reward functions), and the counts of rows skipped."""

  prompts: list[str]
  ids: list[np.ndarray]
  answers: list[str]
  fields: list[dict[str, Any]]
  skipped: int      # No prompt (missing or empty field, or messages that are not a list).
  too_long: int     # Prompts of more than seq_len tokens.


def _prompt_of(row: dict[str, Any], prompt_field: str | None, messages_field: str | None
               ) -> str | list[dict] | None:
  """The row's prompt text or messages, None when it has none."""
  if messages_field is not None:
    value = row.get(messages_field)
    ok = isinstance(value, list) and value and all(map(chat_rows.is_message, value))
    return value if ok else None
  value = row.get(prompt_field)
  return value if isinstance(value, str) and value else None


def read_prompt_rows(files: dict[str, Path], tokenizer: Any, seq_len: int,
                     prompt_field: str | None, messages_field: str | None,
                     answer_field: str | None) -> PromptRows:
  """The rows of `files` tokenized by `tokenizer` (text prompts after its BOS rule, bos_prefix;
  messages through its chat template, chat_encoder, which writes its own BOS), rows without a prompt skipped, prompts longer than `seq_len` tokens counted
  and left out. UserError when no row is left."""
  encoder = None
  if messages_field is not None:
    from paxlike.tokenizers.chat_encoder import load_chat_encoder  # pylint: disable=import-outside-toplevel
    encoder = load_chat_encoder(tokenizer)
  prompts, answers, fields, skipped = [], [], [], 0
  for path in files.values():
    for _, row in text_files.json_rows(path, 'prompt'):
      prompt = _prompt_of(row, prompt_field, messages_field)
      if prompt is None:
        skipped += 1
        continue
      if encoder is not None:
        prompt = encoder.template.render(prompt, add_generation_prompt=True)
      answer = row.get(answer_field) if answer_field else None
      prompts.append(prompt)
      answers.append('' if answer is None else str(answer))
      fields.append(row)
  if encoder is not None:
    ids = [encoder.tokenizer.encode_markup([p])[0][0] for p in prompts]
  else:  # As TRL's tokenizer(prompt): the tokenizer's own BOS rule first (bos_prefix).
    prefix = list(getattr(tokenizer, 'bos_prefix', ()))
    ids = [prefix + list(i) for i in tokenizer.encode_batch(prompts)] if prompts else []
  ids = [np.asarray(i, np.int32) for i in ids]
  keep = [i for i, x in enumerate(ids) if 0 < len(x) <= seq_len]
  too_long = sum(len(x) > seq_len for x in ids)
  if not keep:
    raise UserError(f'PromptData: no prompt row of {len(prompts) + skipped} in data.files has a '
                    f'prompt of 1 to data.seq_len={seq_len} tokens ({skipped} without a prompt, '
                    f'{too_long} longer)')
  pick = lambda xs: [xs[i] for i in keep]
  return PromptRows(pick(prompts), pick(ids), pick(answers), pick(fields), skipped, too_long)
