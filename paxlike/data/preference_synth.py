"""A preference set made from local text, for the tiny DPO experiment (lm.DpoTiny): nothing to
download.

From the Python standard library's modules (the corpus StdlibTiny trains on), each pair's
prompt is a few lines of a module, its chosen completion the line that follows, and its
rejected completion that same line with its words in another order (indentation kept): the two
have the same bytes, so only word order tells them apart, which a model of Python source can
learn and a reward that merely counts bytes cannot.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from paxlike.core import files
from paxlike.data import token_store

# `PreferenceData.files` may name this set so: the file is made on first use (a config stays free
# of side effects and of this machine's paths).
STDLIB_PAIRS = 'synthetic:stdlib_pairs'
FORMAT = 2  # 2: each pair names its module (`module`), a client of the federated experiment.
CONTEXT_LINES = 3
PROMPT_CHARS = 64  # A prompt keeps the last this many characters of its lines.
MIN_WORDS = 3
MAX_LINE = 60


def shuffled_words(line: str, rng: random.Random) -> str | None:
  """`line` with its words (split at single spaces after the indentation) in another order;
  None when it has fewer than MIN_WORDS words or every order is the same."""
  body = line.lstrip(' ')
  words = body.split(' ')
  if len(words) < MIN_WORDS or len(set(words)) < 2:
    return None
  order = list(words)
  while order == words:
    rng.shuffle(order)
  return line[:len(line) - len(body)] + ' '.join(order)


def module_pairs(text: str, rng: random.Random, module: str = '') -> list[dict[str, str]]:
  """The pairs of one module's source: every line of at most MAX_LINE characters that is not a
  comment and that shuffled_words can corrupt, after the last PROMPT_CHARS characters of the
  CONTEXT_LINES lines before it as the prompt; each pair names `module`."""
  lines = text.split('\n')
  pairs = []
  for at in range(CONTEXT_LINES, len(lines)):
    line = lines[at]
    if not line.strip() or len(line) > MAX_LINE or line.lstrip().startswith('#'):
      continue
    rejected = shuffled_words(line, rng)
    if rejected is not None:
      prompt = ('\n'.join(lines[at - CONTEXT_LINES:at]) + '\n')[-PROMPT_CHARS:]
      pairs.append({'prompt': prompt, 'chosen': line, 'rejected': rejected, 'module': module})
  return pairs


def stdlib_pairs(num_pairs: int, seed: int = 0) -> list[dict[str, str]]:
  """`num_pairs` pairs (fewer if the modules run out) from the standard library's modules in
  sorted order, at most num_pairs // 50 + 1 from each."""
  from paxlike.data import stdlib  # pylint: disable=import-outside-toplevel (imports tfds)
  root, rng, pairs = stdlib.default_stdlib_dir(), random.Random(seed), []
  per_module = num_pairs // 50 + 1
  for name in stdlib.stdlib_files(root):
    text = (root / name).read_text(encoding='utf-8', errors='replace')
    found = module_pairs(text, rng, name)
    pairs += rng.sample(found, min(per_module, len(found)))
    if len(pairs) >= num_pairs:
      break
  return pairs[:num_pairs]


def with_synthetic(globs: list[str]) -> list[str]:
  """`globs` with STDLIB_PAIRS replaced by the path of `stdlib_pairs_file()`."""
  return [str(stdlib_pairs_file()) if g == STDLIB_PAIRS else g for g in globs]


def stdlib_pairs_file(num_pairs: int = 4000) -> Path:
  """A JSONL file of `stdlib_pairs(num_pairs)` in the token dir, written once (atomically)."""
  path = token_store.token_dir() / 'synthetic' / f'stdlib-pairs-v{FORMAT}-{num_pairs}.jsonl'
  if not path.is_file():
    path.parent.mkdir(parents=True, exist_ok=True)
    with files.open_atomic(path) as f:
      for pair in stdlib_pairs(num_pairs):
        f.write(json.dumps(pair) + '\n')
  return path
