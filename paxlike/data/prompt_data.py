"""`PromptData`: prompts for GRPO (paxlike/trainer/grpo.py), a batch of prompts per step, and
held-out prompt + answer rows to evaluate on.

A round batch holds `batch_size` prompts: `inputs` int32 [1, 1, B, seq_len] (each prompt's ids
from column 0, padded), `lengths` int32 [1, 1, B], `row` int32 [1, 1, B] (the row's index, for
its answer and fields) and `mask` [1, 1, B, seq_len] (1 on prompt tokens). The trainer's GRPO
step turns it into the G completions per prompt it trains on. Prompts are read epoch after
epoch, each epoch in a fresh order of (seed, epoch), so a batch is a pure function of
(seed, step). Eval batches are LM batches (`inputs`, `targets`, `mask` [eval_batch_size,
eval_len]) of each held-out prompt followed by its answer and EOS, the mask on the answer and
EOS (on the prompt where rows have no answer): eval_loss is the answer's NLL per token.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from paxlike.data import sources
from paxlike.data import text_files
from paxlike.data.prompt_rows import PromptRows, read_prompt_rows
from paxlike.data.token_source import TokenizedSource
from paxlike.errors import UserError


@dataclasses.dataclass
class PromptData(TokenizedSource):
  """Prompt rows (prompt_rows.py) as prompt batches for GRPO; see the module docstring.
  `seq_len`: the longest prompt in tokens (longer rows are counted and left out)."""

  files: str | Sequence[str] = ()
  tokenizer: str = 'bytes'
  seq_len: int = 256
  batch_size: int = 8  # Prompts per step (each sampled loss.num_generations times).
  eval_fraction: float = 0.05
  num_eval_batches: int | None = 4
  eval_batch_size: int = 16
  prompt_field: str | None = 'prompt'
  messages_field: str | None = None
  answer_field: str | None = 'answer'
  clients_per_round: int = 1
  local_steps: int = 1
  sampling: str = 'uniform'

  item: ClassVar[sources.Item] = 'tokens'
  batch_kind: ClassVar[str] = 'prompts'  # Trains with GRPO's loss (trainer/grpo.py).
  partition: ClassVar[str] = 'pooled'  # One stream of prompts: no clients.

  def __post_init__(self):
    sources.check_fields(self, ['seq_len', 'batch_size', 'clients_per_round', 'local_steps',
                                'eval_batch_size'], {'sampling': sources.SAMPLINGS})
    if self.clients_per_round != 1 or self.local_steps != 1:
      raise UserError('PromptData: GRPO samples from the one current model, so '
                      'data.clients_per_round and data.local_steps must be 1')
    globs = [self.files] if isinstance(self.files, str) else self.files
    if not isinstance(globs, (list, tuple)) or not globs or not all(
        isinstance(g, str) and g for g in globs):
      raise UserError(f'PromptData.files must be a glob or a list of globs, got {self.files!r}')
    if (self.prompt_field is None) == (self.messages_field is None):
      raise UserError('PromptData: set one of prompt_field (text prompts) and messages_field '
                      f'(chat prompts), got {self.prompt_field!r} and {self.messages_field!r}')
    if not isinstance(self.eval_fraction, (int, float)) or not 0 < self.eval_fraction < 1:
      raise UserError(f'PromptData.eval_fraction must be in (0, 1), got {self.eval_fraction!r}')
    value = self.num_eval_batches
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value <= 0):
      raise UserError(f'PromptData.num_eval_batches must be a positive int or None, got '
                      f'{value!r}')

  def prepare(self) -> None:
    """Reads and tokenizes the prompt rows, and splits them."""
    _ = self._eval_rows

  def row_spec(self) -> dict[str, sources.Spec]:
    """A prompt: int32 ids (padded to seq_len), length and row index, float32 mask."""
    ints = sources.Spec((self.seq_len,), np.dtype(np.int32))
    one = sources.Spec((), np.dtype(np.int32))
    return {'inputs': ints, 'lengths': one, 'row': one,
            'mask': sources.Spec((self.seq_len,), np.dtype(np.float32))}

  def batch_spec(self) -> sources.BatchSpec:
    """A round's prompts, and eval batches of held-out prompt + answer as LM rows as wide as
    the longest of them."""
    spec, width = super().batch_spec(), self._eval_rows[1]
    ints = sources.Spec((self.eval_batch_size, width), np.dtype(np.int32))
    return spec._replace(eval={'inputs': ints, 'targets': ints, 'mask': sources.Spec(
        (self.eval_batch_size, width), np.dtype(np.float32))})

  @functools.cached_property
  def rows(self) -> PromptRows:
    return read_prompt_rows(text_files.expand(self.files), self.loaded_tokenizer, self.seq_len,
                            self.prompt_field, self.messages_field, self.answer_field)

  @functools.cached_property
  def split(self) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, held-out rows): a fixed share `eval_fraction` of the rows held out, picked
    by a permutation that depends on nothing but the row count."""
    n = len(self.rows.ids)
    held = min(max(1, round(n * self.eval_fraction)), n - 1)
    if n < 2:
      raise UserError(f'PromptData: {n} prompt row; training and held-out rows need 2 or more')
    order = np.random.default_rng(n).permutation(n)
    return np.sort(order[held:]), np.sort(order[:held])

  @property
  def client_names(self) -> tuple[str, ...]:
    return ('pooled',)

  @property
  def client_sizes(self) -> np.ndarray:
    """The one client's training prompts."""
    return np.array([len(self.split[0])], np.int64)

  def stop_id(self) -> int:
    """The token a completion stops at: the chat template's end of turn, else EOS."""
    if self.messages_field is not None:
      from paxlike.tokenizers.chat_encoder import load_chat_encoder  # pylint: disable=import-outside-toplevel
      encoder = load_chat_encoder(self.loaded_tokenizer)
      return encoder.eos_id if encoder.end_of_turn_id is None else encoder.end_of_turn_id
    return self.loaded_tokenizer.eos_id

  def prompt_rows(self, seed: int, step: int) -> np.ndarray:
    """int64 [batch_size]: the rows of step `step`'s prompts."""
    train = self.split[0]
    positions = step * self.batch_size + np.arange(self.batch_size)
    epochs, at = np.divmod(positions, len(train))
    orders = {e: sources.round_rng(seed, e, sources.EXAMPLE_STREAM).permutation(len(train))
              for e in np.unique(epochs).tolist()}
    return train[[orders[e][i] for e, i in zip(epochs.tolist(), at.tolist())]]

  def round_batches(self, seed: int, step: int, clients: slice = slice(None),
                    rows: slice = slice(None), cohort: np.ndarray | None = None
                    ) -> tuple[sources.Batch, np.ndarray]:
    """Step `step`'s prompt batch (module docstring), rows `rows` of it, and weight [1]. Its
    one client is every round's cohort: `cohort` may only say so ([0])."""
    if cohort is not None:
      sources.checked_cohort(self, cohort)
    picked = self.prompt_rows(seed, step)
    ids = [self.rows.ids[r] for r in picked.tolist()]
    pad = self.loaded_tokenizer.pad_id or 0
    inputs = np.full((len(ids), self.seq_len), pad, np.int32)
    for i, prompt in enumerate(ids):
      inputs[i, :len(prompt)] = prompt
    lengths = np.asarray([len(p) for p in ids], np.int32)
    mask = (np.arange(self.seq_len)[None] < lengths[:, None]).astype(np.float32)
    batch = {'inputs': inputs, 'lengths': lengths, 'row': picked.astype(np.int32), 'mask': mask}
    batch = {k: v[None, None][clients][:, :, rows] for k, v in batch.items()}
    return batch, np.ones(1, np.float32)[clients]

  @functools.cached_property
  def _eval_rows(self) -> tuple[np.ndarray, int]:
    """([batches, eval_batch_size] held-out rows, -1 for none; the eval width)."""
    held, b = self.split[1], self.eval_batch_size
    count = (math.ceil(len(held) / b) * b if self.num_eval_batches is None
             else self.num_eval_batches * b)
    at = (np.linspace(0, len(held) - 1, count).astype(np.int64) if len(held) >= count else
          np.concatenate([np.arange(len(held)), np.full(count - len(held), -1)]))
    picked = np.where(at >= 0, held[np.maximum(at, 0)], -1).reshape(-1, b)
    width = max(len(self._eval_tokens(r)[0]) for r in held.tolist()) - 1
    return picked, width

  def _eval_tokens(self, row: int) -> tuple[np.ndarray, int]:
    """(prompt + answer + stop ids, where the scored targets start) of held-out row `row`."""
    prompt, answer = self.rows.ids[row], self.rows.answers[row]
    if not answer:
      return np.concatenate([prompt, [self.stop_id()]]).astype(np.int32), 0
    answer_ids = self.loaded_tokenizer.encode_batch([answer])[0]
    tokens = np.concatenate([prompt, answer_ids, [self.stop_id()]]).astype(np.int32)
    return tokens, len(prompt) - 1

  def eval_batches(self, rows: slice = slice(None)) -> list[sources.Batch]:
    """The held-out rows as LM batches [eval_batch_size, eval width] (module docstring)."""
    picked, width = self._eval_rows
    pad = self.loaded_tokenizer.pad_id or 0
    out = []
    for batch_rows in picked:
      inputs = np.full((len(batch_rows), width), pad, np.int32)
      targets, mask = inputs.copy(), np.zeros(inputs.shape, np.float32)
      for i, r in enumerate(batch_rows.tolist()):
        if r < 0:
          continue
        tokens, start = self._eval_tokens(r)
        inputs[i, :len(tokens) - 1], targets[i, :len(tokens) - 1] = tokens[:-1], tokens[1:]
        mask[i, start:len(tokens) - 1] = 1.0
      out.append({k: v[rows] for k, v in
                  {'inputs': inputs, 'targets': targets, 'mask': mask}.items()})
    return out

  def config_lines(self) -> str:
    """'# prompts: ...': the rows trained and held out, and those skipped or too long."""
    r = self.rows
    return (f'# prompts: {len(self.split[0]):,} train, {len(self.split[1]):,} held out; '
            f'{r.skipped:,} skipped (no prompt), {r.too_long:,} longer than '
            f'data.seq_len={self.seq_len} tokens\n')

  def tokenizer_fingerprint(self) -> str:
    """What the prompts' ids depend on of the tokenizer: its file's bytes (and with chat
    prompts, its template's), never its path: a job's first start points `tokenizer` at the
    job's own copy (trainer/job_source.py), and a job dir may be moved. 'bytes' for bytes."""
    if self.messages_field is not None:
      from paxlike.tokenizers.chat_encoder import load_chat_encoder  # pylint: disable=import-outside-toplevel
      return load_chat_encoder(self.loaded_tokenizer).fingerprint
    prefix = getattr(self.loaded_tokenizer, 'bos_prefix', ())
    fp = self.loaded_tokenizer.fingerprint  # With its BOS rule (tokenizer_config.json's).
    return f'{fp} bos {list(prefix)}' if prefix else fp

  def fingerprint(self) -> dict[str, str]:
    """The job dir's record of the data: a hash of the files' bytes, the tokenizer's content
    (tokenizer_fingerprint) and the reading fields."""
    digest = hashlib.sha256()
    for name, path in sorted(text_files.expand(self.files).items()):
      digest.update(name.encode() + b'\0' + path.read_bytes() + b'\0')
    digest.update(repr((self.tokenizer_fingerprint(), self.seq_len, self.prompt_field,
                        self.messages_field, self.answer_field)).encode())
    globs = [self.files] if isinstance(self.files, str) else list(self.files)
    return {'dataset': 'prompts', 'sha256': digest.hexdigest(),
            'source': f'{", ".join(globs)} (tokenizer {self.tokenizer})'}

  def describe(self) -> dict[str, Any]:
    """Prompt counts (trained, held out, skipped, too long) and the tokenizer."""
    return {'dataset': 'prompts', 'train_prompts': len(self.split[0]),
            'eval_prompts': len(self.split[1]), 'skipped': self.rows.skipped,
            'too_long': self.rows.too_long, 'tokenizer': self.tokenizer,
            'vocab_size': self.vocab_size, 'seq_len': self.seq_len}
