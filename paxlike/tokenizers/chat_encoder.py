"""Conversations into token ids and an assistant mask, through a checkpoint's own tokenizer and
chat template (the ids transformers' `apply_chat_template(..., tokenize=True)` gives).

Which tokens are trained (the mask): with {% generation %} blocks in the template, the tokens of
those blocks (transformers' `return_assistant_tokens_mask`). Otherwise each assistant message's
tokens: what rendering messages[:i + 1] adds after rendering messages[:i] with the generation
prompt (so the role header is context, not target), cut after the turn's last stop token (the
template's end-of-turn, e.g. <|im_end|> / <|eot_id|> / <end_of_turn>, or eos). The end-of-turn
is trained because it is what stops generation; the separator some templates write after it
('\\n' in ChatML and Gemma) is not, since decoding stops before it. (Where the generation
prompt's text does not lead the reply's, the reply starts where its content does; see
_reply_start.) Some templates close a conversation with text they write only when no generation prompt
follows (Phi-3's `{% else %}{{ eos_token }}`): that closing text (_closing_text) is rendered, as
transformers renders it, but it belongs to no turn, so it is left out of each reply's span (at
the end, and where messages[:i + 1] is rendered alone). A template whose text of messages[:i + 1],
less that closing text, does not lead the text of the whole conversation (one that rewrites
earlier turns) is refused: its turns cannot be told apart without generation blocks.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Sequence

import numpy as np

from paxlike.errors import UserError
from paxlike.tokenizers.chat_template import ChatTemplate, Span, load_chat_template
from paxlike.tokenizers.documents import DocumentRefused
from paxlike.tokenizers.hf_tokenizer import HfTokenizer

PROBE = 'paxlike-probe-reply'  # A reply whose text is found again in the probe render.


def load_chat_encoder(tokenizer: Any) -> 'ChatEncoder':
  """The ChatEncoder of a loaded tokenizer and the chat template beside its file; a tokenizer
  that is not a Hugging Face tokenizer.json is a UserError."""
  if not isinstance(tokenizer, HfTokenizer):
    raise UserError(f'chat data and --chat need a Hugging Face tokenizer.json with a chat '
                    f'template beside it; the tokenizer is {tokenizer!r}')
  return ChatEncoder(tokenizer, load_chat_template(tokenizer.path))


class ChatEncoder:
  """`tokenizer` with `template`. It stands in for the tokenizer where the token store is built:
  the same ids, and a fingerprint of both (a changed template is another store)."""

  kind = 'hf'

  def __init__(self, tokenizer: HfTokenizer, template: ChatTemplate):
    self.tokenizer, self.template = tokenizer, template
    self.vocab_size, self.path = tokenizer.vocab_size, tokenizer.path
    self.eos_id, self.bos_id, self.pad_id = tokenizer.eos_id, tokenizer.bos_id, tokenizer.pad_id
    self.fingerprint = hashlib.sha256(
        f'{tokenizer.fingerprint} {template.fingerprint}'.encode()).hexdigest()
    self.end_of_turn_id = self._end_of_turn_id()
    self.stop_ids = frozenset({self.eos_id} | ({self.end_of_turn_id} - {None}))

  def _end_of_turn_id(self) -> int | None:
    """The first added token (<|im_end|>, <|eot_id|>, <end_of_turn>, eos...) the template
    writes after an assistant reply (None when it writes none, or cannot render a one-turn
    exchange)."""
    try:
      text = self.template.render([{'role': 'user', 'content': 'Hi'},
                                   {'role': 'assistant', 'content': PROBE}])
    except UserError:
      return None
    at = text.rfind(PROBE)
    if at < 0:
      return None
    [(ids, offsets)] = self.tokenizer.encode_markup([text])
    added = self.tokenizer.added_ids
    after = [int(i) for i in ids[offsets[:, 0] >= at + len(PROBE)] if int(i) in added]
    return after[0] if after else None

  def assistant_spans(self, messages: list[dict]) -> tuple[str, list[Span], bool]:
    """The text of `messages`, the character spans of its assistant output, and whether they
    are the template's own {% generation %} blocks (else one span per assistant message)."""
    if self.template.has_generation_blocks:
      return (*self.template.render_tracked(messages), True)
    full = self.template.render(messages)
    closing = self._closing_text(messages, full)
    spans: list[Span] = []
    for i, message in enumerate(messages):
      if message.get('role') != 'assistant':
        continue
      upto = self.template.render(messages[:i + 1])
      if closing and upto.endswith(closing) and (upto == full or not full.startswith(upto)):
        upto = upto[:-len(closing)]
      start = self._reply_start(messages, i, upto)
      if not full.startswith(upto) or (spans and start < spans[-1][1]):
        raise UserError(
            f'chat template {self.template.path}: the text of messages[:{i + 1}] does not lead '
            f'the text of the whole conversation (the template rewrites earlier turns), so the '
            'assistant tokens cannot be told apart; a template with {% generation %} blocks '
            'marks them')
      spans.append((start, len(upto)))
    return full, spans, False

  def _closing_text(self, messages: list[dict], full: str) -> str:
    """The end of `full` (the text of `messages`) that the template writes only when no
    generation prompt follows: where full's ids part from those of the same messages with the
    generation prompt ('' when that text leads with all of full, as most templates' does).
    Compared by ids, so the split falls between tokens ('<|endoftext|>' and '<|assistant|>'
    share the characters '<|')."""
    prompted = self.template.render(messages, add_generation_prompt=True)
    if prompted.startswith(full):
      return ''
    (ids, offsets), (other, _) = self.tokenizer.encode_markup([full, prompted])
    same = np.flatnonzero(ids[:len(other)] != other[:len(ids)])
    parted = int(same[0]) if len(same) else min(len(ids), len(other))
    return full[int(offsets[parted, 0]):] if parted < len(ids) else ''

  def _reply_start(self, messages: list[dict], i: int, upto: str) -> int:
    """Where assistant message i begins in `upto`, the text of messages[:i + 1]: after the
    text of messages[:i] with the generation prompt when that leads it, else (a template whose
    prompt depends on what follows, as Mistral's places the system message by the last turn)
    where `upto` first differs from the text with that message's content empty."""
    head = self.template.render(messages[:i], add_generation_prompt=True)
    if upto.startswith(head):
      return len(head)
    emptied = self.template.render([*messages[:i], {**messages[i], 'content': ''}])
    return len(os.path.commonprefix([upto, emptied]))

  def encode_conversation(self, messages: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(int32 ids, bool trained) of `messages`: the ids of the template's text, and which
    tokens are assistant output (see the module docstring)."""
    return self.encode_batch([messages])[0]

  def encode_batch(self, conversations: Sequence[list[dict]]
                   ) -> list[tuple[np.ndarray, np.ndarray]]:
    """encode_conversation of each conversation, their texts encoded in one library call."""
    rendered = [self._spans_of(index, messages) for index, messages in enumerate(conversations)]
    encoded = self.tokenizer.encode_markup([text for text, _, _ in rendered])
    return [(ids, self._trained(ids, offsets, spans, marked))
            for (ids, offsets), (_, spans, marked) in zip(encoded, rendered)]

  def _spans_of(self, index: int, messages: list[dict]) -> tuple[str, list[Span], bool]:
    """assistant_spans of conversation `index` of a batch; a refusal says which it is."""
    try:
      return self.assistant_spans(messages)
    except UserError as error:
      raise DocumentRefused(str(error), index) from None

  def _trained(self, ids: np.ndarray, offsets: np.ndarray, spans: list[Span],
               marked: bool) -> np.ndarray:
    """bool [len(ids)]: the tokens overlapping `spans`, each span's cut after its last stop
    token unless the spans are the template's own generation blocks (`marked`)."""
    trained = np.zeros(len(ids), bool)
    stops = np.isin(ids, list(self.stop_ids))
    for start, end in spans:
      inside = np.flatnonzero((offsets[:, 0] < end) & (offsets[:, 1] > start))
      if not len(inside):
        continue
      first, last = int(inside[0]), int(inside[-1])
      stopped = np.flatnonzero(stops[first:last + 1])
      if not marked and len(stopped):
        last = first + int(stopped[-1])
      trained[first:last + 1] = True
    return trained

  def encode_conversations(self, texts: Sequence[str], dtype: np.dtype
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(tokens in `dtype`, int64 lengths, int32 prompt lengths (0), bool trained) of the
    conversations `texts` (each a JSON list of messages) back to back, as the token store's
    build takes a chunk. No EOS is appended: the template ends each turn itself."""
    encoded = self.encode_batch([json.loads(text) for text in texts])
    lengths = np.fromiter((len(ids) for ids, _ in encoded), np.int64, len(encoded))
    tokens = (np.concatenate([ids for ids, _ in encoded]) if encoded else np.zeros(0, np.int32))
    trained = (np.concatenate([t for _, t in encoded]) if encoded else np.zeros(0, bool))
    return (tokens.astype(dtype), lengths, np.zeros(len(encoded), np.int32), trained)

  def prompt_ids(self, prompt: str) -> np.ndarray:
    """The ids of `prompt` as one user turn followed by the generation prompt (`--chat`)."""
    text = self.template.render([{'role': 'user', 'content': prompt}],
                                add_generation_prompt=True)
    return self.tokenizer.encode_markup([text])[0][0]

  def generation_prompt_note(self) -> str | None:
    """A note for `--chat` when the template ignores add_generation_prompt (a user turn's text
    is the same with and without it), else None: the reply is sampled right after the user's
    turn, with no assistant header."""
    turn = [{'role': 'user', 'content': 'Hi'}]
    try:
      ignored = (self.template.render(turn, add_generation_prompt=True)
                 == self.template.render(turn))
    except UserError:
      return None  # A template that cannot render one user turn fails in prompt_ids itself.
    if not ignored:
      return None
    return (f'note: chat template {self.template.path} ignores add_generation_prompt (a user '
            'turn renders the same with and without it), so each reply is sampled right after '
            "the user's turn with no assistant header: right for templates whose user turn "
            "ends the prompt (Mistral's [/INST]); with others the model may go on with the "
            "user's turn")

  def reply_text(self, ids: Sequence[int]) -> str:
    """The text of generated `ids`, cut before the first stop token."""
    ids = [int(i) for i in ids]
    stop = next((at for at, i in enumerate(ids) if i in self.stop_ids), len(ids))
    return self.tokenizer.decode(ids[:stop])

  def __repr__(self) -> str:
    return f'ChatEncoder({self.tokenizer!r}, {self.template!r})'
