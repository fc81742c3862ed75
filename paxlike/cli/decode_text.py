"""`--mode=decode`: prompts in, each followed by its sampled continuation out."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from jax.sharding import Mesh

from paxlike.errors import UserError
from paxlike.experiment import Task


@dataclasses.dataclass(frozen=True)
class Sampling:
  """How to continue each prompt: at most `max_new_tokens`, at `temperature` (0 = greedy) among
  the `top_k` likeliest (0 = all) within probability `top_p`, from `seed`."""

  max_new_tokens: int
  temperature: float
  top_k: int
  top_p: float
  seed: int

  def check(self) -> None:
    """UserError naming the flags when a value is out of range."""
    if (self.max_new_tokens <= 0 or self.temperature < 0 or self.top_k < 0
        or not 0 < self.top_p <= 1):
      raise UserError('--decode_length must be positive, --temperature and --top_k '
                      'non-negative, --top_p in (0, 1]')


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


def decoded_text(task: Task, mesh: Mesh, params: Any, prompts: list[str],
                 sampling: Sampling, chat: bool = False) -> str:
  """Each prompt followed by its continuation, one block per prompt: sampled with a KV cache on
  the training mesh, in tokens of the data's tokenizer, stopping at its EOS (the byte
  tokenizer's EOS is a newline, a separator: byte LMs run to --decode_length). With `chat`,
  each prompt is a user turn of the tokenizer's chat template (chat_replies)."""
  from paxlike.decode import cache_len_for, generate_text  # pylint: disable=import-outside-toplevel
  from paxlike.tokenizers import load_tokenizer  # pylint: disable=import-outside-toplevel
  tokenizer = getattr(task.data, 'loaded_tokenizer', None) or load_tokenizer('bytes')
  if chat:
    return chat_replies(task, mesh, params, tokenizer, prompts, sampling)
  longest = max(len(ids) for ids in tokenizer.encode_batch(prompts))
  cache_len = cache_len_for(task.model, longest, sampling.max_new_tokens)
  texts = generate_text(task.model, params, tokenizer, prompts,
                        stop_at_eos=tokenizer.kind != 'bytes',
                        max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                        top_k=sampling.top_k, top_p=sampling.top_p, seed=sampling.seed,
                        cache_len=cache_len, mesh=mesh, rules=task.mesh.rules)
  return '\n\n'.join(prompt + text for prompt, text in zip(prompts, texts))


def chat_replies(task: Task, mesh: Mesh, params: Any, tokenizer: Any, prompts: list[str],
                 sampling: Sampling) -> str:
  """`user: PROMPT` and `assistant: REPLY` for each prompt, blocks apart by a blank line: the
  prompt rendered by the tokenizer's chat template as one user turn with the generation prompt,
  the reply sampled until the template's end-of-turn token (or EOS, or --decode_length)."""
  from paxlike.decode import cache_len_for, generate  # pylint: disable=import-outside-toplevel
  from paxlike.decode.text import check_vocab  # pylint: disable=import-outside-toplevel
  from paxlike.tokenizers.chat_encoder import load_chat_encoder  # pylint: disable=import-outside-toplevel
  encoder = load_chat_encoder(tokenizer)
  check_vocab(task.model, tokenizer)
  ids = [encoder.prompt_ids(prompt) for prompt in prompts]
  stop = encoder.eos_id if encoder.end_of_turn_id is None else encoder.end_of_turn_id
  rows = generate(task.model, params, ids, eos_id=stop, pad_id=tokenizer.pad_id,
                  max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                  top_k=sampling.top_k, top_p=sampling.top_p, seed=sampling.seed,
                  cache_len=cache_len_for(task.model, max(map(len, ids)),
                                          sampling.max_new_tokens),
                  mesh=mesh, rules=task.mesh.rules)
  return '\n\n'.join(f'user: {prompt}\nassistant: {encoder.reply_text(row)}'
                       for prompt, row in zip(prompts, rows))
