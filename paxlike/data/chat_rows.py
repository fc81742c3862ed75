"""Chat rows: a JSONL or Parquet row's messages (`[{"role": ..., "content": ...}, ...]`, the
format chat data ships in) as the document text the token store build passes on: the messages as
JSON, which paxlike/tokenizers/chat_encoder.py renders with the checkpoint's chat template."""

from __future__ import annotations

import json
from typing import Any


def is_message(value: Any) -> bool:
  """Whether `value` is one chat message: a dict with a string role and string content (other
  keys, such as name or tool_calls, are kept for the template)."""
  return (isinstance(value, dict) and isinstance(value.get('role'), str)
          and isinstance(value.get('content'), str))


def conversation_text(value: Any) -> str | None:
  """The JSON text of the conversation `value`: None when it is not a non-empty list of
  messages (the row is counted as missing), '' when no message is the assistant's (nothing to
  train on: the row is counted as empty)."""
  if not isinstance(value, list) or not value or not all(map(is_message, value)):
    return None
  if not any(message['role'] == 'assistant' for message in value):
    return ''
  return json.dumps(value, ensure_ascii=False)
