"""`--mode=decode`: prompts in, each followed by its sampled continuation out."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from jax.sharding import Mesh

from paxlike.decode.sampling import Sampling
from paxlike.errors import UserError
from paxlike.trainer.task import Task

# Prompts decoded together: a --prompts_file of more goes in batches of this many (the last
# padded with idle rows), all through one compiled prefill and loop.
BATCH_SIZE = 32


def batch_rows(prompts: int) -> int:
  """The rows of a decode batch for `prompts` prompts: the smallest power of two that holds
  them, at most BATCH_SIZE. Each row costs a whole row's work every step, idle or not, and
  powers of two keep the compiled shapes few for the persistent compilation cache."""
  rows = 1
  while rows < min(prompts, BATCH_SIZE):
    rows *= 2
  return rows


@dataclasses.dataclass(frozen=True)
class DecodeRequest:
  """What --mode=decode asks for: at most `max_new_tokens` after each prompt, each token picked
  as `sampling` says (its own checks: paxlike.decode.Sampling), from `seed`."""

  max_new_tokens: int
  sampling: Sampling
  seed: int

  def __post_init__(self):
    if self.max_new_tokens <= 0:
      raise UserError(f'--decode_length must be positive, got {self.max_new_tokens}')


def read_prompts(prompts_file: str | None, prompt: str) -> list[str]:
  """The non-empty lines of `prompts_file`, else [`prompt`]."""
  if not prompts_file:
    return [prompt]
  path = Path(prompts_file).expanduser()
  try:
    prompts = [line for line in path.read_text().splitlines() if line.strip()]
  except (OSError, UnicodeDecodeError) as error:
    raise UserError(f'--prompts_file {path} cannot be read ({error})') from None
  if not prompts:
    raise UserError(f'--prompts_file {path} holds no prompt')
  return prompts


def fit_context(ids: list[np.ndarray], max_len: int, max_new_tokens: int
                ) -> tuple[list[np.ndarray], int, list[str]]:
  """(prompts, new tokens, notes) that fit the `max_len` positions the model attends: a prompt
  longer than max_len - 1 tokens keeps its last max_len - 1, and the new tokens stop where the
  longest prompt plus them fill the context (the last new token takes no slot). The notes say
  what was cut, for stderr."""
  keep, notes = max_len - 1, []
  cut = [i for i, prompt in enumerate(ids) if len(prompt) > keep]
  if cut:
    notes.append(f'{len(cut)} prompt(s) are longer than the model attends (max_len={max_len}) '
                 f'and keep their last {keep} tokens (prompt {cut[0]} had {len(ids[cut[0]])})')
  ids = [prompt[-keep:] for prompt in ids]
  longest = max(len(prompt) for prompt in ids)
  room = max_len + 1 - longest
  if max_new_tokens > room:
    notes.append(f'--decode_length={max_new_tokens} is past what the model attends '
                 f'(max_len={max_len}, longest prompt {longest} tokens): decoding {room} tokens')
  return ids, min(max_new_tokens, room), notes


def first_token_reporter(started: float | None):
  """A callback printing `time to first token: S s` on stderr, counted from `started`
  (time.monotonic()); None without a start."""
  if started is None:
    return None
  return lambda: print(f'time to first token: {time.monotonic() - started:.2f} s',
                       file=sys.stderr, flush=True)


def _fitted(task: Task, ids: list[np.ndarray], request: DecodeRequest,
            started: float | None = None) -> tuple[list[np.ndarray], dict[str, Any]]:
  """The prompts cut to the model's context and `generate`'s options: sampling, batches of
  `batch_rows`, the first token's time reported from `started` (notes printed), and the
  traces kept beside the compilation cache (core.program_store)."""
  from paxlike.decode import cache_len_for  # pylint: disable=import-outside-toplevel
  ids, new_tokens, notes = fit_context(ids, task.model.max_len, request.max_new_tokens)
  for note in notes:
    print(f'note: {note}', file=sys.stderr)
  from paxlike.core import program_store  # pylint: disable=import-outside-toplevel
  return ids, dict(max_new_tokens=new_tokens, **dataclasses.asdict(request.sampling),
                   seed=request.seed,
                   cache_len=cache_len_for(task.model, max(map(len, ids)), new_tokens),
                   batch_size=batch_rows(len(ids)),
                   on_first_token=first_token_reporter(started),
                   store=program_store.current())


def prompt_ids(tokenizer: Any, prompts: list[str]) -> list[np.ndarray]:
  """Each text prompt's ids as GRPO's prompt rows and TRL tokenize it: the tokenizer's own BOS
  rule first (`bos_prefix`: its post-processor's, or tokenizer_config.json's add_bos_token),
  then the text's ids."""
  prefix = list(getattr(tokenizer, 'bos_prefix', ()))
  return [np.asarray(prefix + list(ids), np.int32) for ids in tokenizer.encode_batch(prompts)]


def decoded_text(task: Task, mesh: Mesh, params: Any, prompts: list[str],
                 request: DecodeRequest, chat: bool = False, started: float | None = None
                 ) -> str:
  """Each prompt followed by its continuation, one block per prompt: sampled with a KV cache on
  the training mesh, in tokens of the data's tokenizer, stopping at its EOS (the byte
  tokenizer's EOS is a newline, a separator: byte LMs run to --decode_length), within the
  positions the model attends (`fit_context`), each prompt after the tokenizer's BOS where it
  adds one (`prompt_ids`). With `chat`, each prompt is a user turn of the
  tokenizer's chat template (chat_replies). With `started` (time.monotonic()), the time from
  it to the first token is printed on stderr."""
  from paxlike.decode import generate  # pylint: disable=import-outside-toplevel
  from paxlike.decode.text import check_prompts, continuations  # pylint: disable=import-outside-toplevel
  from paxlike.tokenizers import load_tokenizer  # pylint: disable=import-outside-toplevel
  tokenizer = task.data.loaded_tokenizer or load_tokenizer('bytes')
  if chat:
    return chat_replies(task, mesh, params, tokenizer, prompts, request, started)
  check_prompts(task.model, tokenizer, prompts)
  ids, options = _fitted(task, prompt_ids(tokenizer, prompts), request, started)
  eos_id = tokenizer.eos_id if tokenizer.kind != 'bytes' else None
  rows = generate(task.model, params, ids, eos_id=eos_id, pad_id=tokenizer.pad_id, mesh=mesh,
                  rules=task.mesh.rules, **options)
  return '\n\n'.join(prompt + text
                       for prompt, text in zip(prompts, continuations(tokenizer, rows, eos_id)))


def chat_replies(task: Task, mesh: Mesh, params: Any, tokenizer: Any, prompts: list[str],
                 request: DecodeRequest, started: float | None = None) -> str:
  """`user: PROMPT` and `assistant: REPLY` for each prompt, blocks apart by a blank line: the
  prompt rendered by the tokenizer's chat template as one user turn with the generation prompt,
  the reply sampled until the template's end-of-turn token (or EOS, or --decode_length)."""
  from paxlike.decode import generate  # pylint: disable=import-outside-toplevel
  from paxlike.decode.text import check_vocab  # pylint: disable=import-outside-toplevel
  from paxlike.tokenizers.chat_encoder import load_chat_encoder  # pylint: disable=import-outside-toplevel
  encoder = load_chat_encoder(tokenizer)
  check_vocab(task.model, tokenizer)
  if (note := encoder.generation_prompt_note()) is not None:
    print(note, file=sys.stderr, flush=True)
  ids, options = _fitted(task, [encoder.prompt_ids(prompt) for prompt in prompts], request,
                         started)
  stop = encoder.eos_id if encoder.end_of_turn_id is None else encoder.end_of_turn_id
  rows = generate(task.model, params, ids, eos_id=stop, pad_id=tokenizer.pad_id, mesh=mesh,
                  rules=task.mesh.rules, **options)
  return '\n\n'.join(f'user: {prompt}\nassistant: {encoder.reply_text(row)}'
                       for prompt, row in zip(prompts, rows))
