"""A task with a verifiable answer made locally, for the tiny GRPO experiment (lm.GrpoTiny):
short additions such as `prompt` '37+58=' with `answer` '95' (also as `completion`, so the
same file is SFT data for TextData(prompt_field='prompt'), which a GRPO run starts from).

  python -m paxlike.data.arithmetic_synth --out=/tmp/paxlike/arithmetic/arithmetic.jsonl

Operands are drawn uniformly from [0, 10**digits); the rows are a pure function of the seed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

from paxlike.core import files

DEFAULT_FILE = '/tmp/paxlike/arithmetic/arithmetic.jsonl'


def addition_rows(num_rows: int, digits: int = 2, seed: int = 0) -> list[dict[str, str]]:
  """`num_rows` rows {'prompt': 'a+b=', 'answer': str(a + b), 'completion': str(a + b)}."""
  rng, high = random.Random(seed), 10**digits - 1
  rows = []
  for _ in range(num_rows):
    a, b = rng.randint(0, high), rng.randint(0, high)
    rows.append({'prompt': f'{a}+{b}=', 'answer': str(a + b), 'completion': str(a + b)})
  return rows


def write_rows(path: str | os.PathLike, rows: list[dict[str, str]]) -> Path:
  """`rows` as JSONL at `path` (written atomically; directories made)."""
  path = Path(path).expanduser()
  path.parent.mkdir(parents=True, exist_ok=True)
  files.write_text(path, ''.join(json.dumps(row) + '\n' for row in rows))
  return path


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', default=DEFAULT_FILE)
  parser.add_argument('--rows', type=int, default=20_000)
  parser.add_argument('--digits', type=int, default=2)
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args(argv)
  if args.rows < 1 or args.digits < 1:
    parser.error('--rows and --digits must be positive')
  path = write_rows(args.out, addition_rows(args.rows, args.digits, args.seed))
  print(f'wrote {args.rows} rows to {path}')


if __name__ == '__main__':
  main()
