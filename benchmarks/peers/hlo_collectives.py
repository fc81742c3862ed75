"""The collectives and fusions of an optimized HLO module, for comparing two systems' steps.

  python benchmarks/peers/hlo_collectives.py A.after_optimizations.txt [B...] [--shapes]

Reads XLA's text dump (`--xla_dump_to=DIR --xla_dump_hlo_as_text`, as
`benchmarks/peers/maxtext_step.py --dump_hlo` writes) and prints one JSON object per file:
per collective kind (all-gather, reduce-scatter, all-reduce, all-to-all, collective-permute;
`-start` forms counted as theirs) the count and the bytes of its results per device; the
number of fusions and of top-level instructions in the entry computation; and with
`--shapes` each collective's result shapes, the largest first (where weights are gathered and
what is reduced).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
from pathlib import Path
from typing import Any

KINDS = ('all-gather', 'reduce-scatter', 'all-reduce', 'all-to-all', 'collective-permute')
BYTES = {'f32': 4, 's32': 4, 'u32': 4, 'bf16': 2, 'f16': 2, 'pred': 1, 's8': 1, 'u8': 1,
         'f64': 8, 's64': 8, 'u64': 8}
INSTRUCTION = re.compile(r'^\s*(?:ROOT\s+)?%?[\w.\-]+ = (.+?) ([\w\-]+)\(')
ARRAY = re.compile(r'\b([a-z]+\d*)\[([\d,]*)\]')


def array_bytes(shape_text: str) -> int:
  """Bytes of every array in an HLO result type (a tuple sums its elements)."""
  total = 0
  for dtype, dims in ARRAY.findall(shape_text):
    if dtype in BYTES:
      total += BYTES[dtype] * math.prod(int(d) for d in dims.split(',') if d)
  return total


def entry_lines(text: str) -> list[str]:
  """The instruction lines of the ENTRY computation."""
  start = text.index('\nENTRY ')
  end = text.find('\n}\n', start)
  return text[start:end].splitlines()[1:]


def summarize(text: str, shapes: bool = False) -> dict[str, Any]:
  """Collective counts and bytes, fusion and instruction counts of one optimized module."""
  counts: collections.Counter = collections.Counter()
  sizes: collections.Counter = collections.Counter()
  seen: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)
  for line in text.splitlines():
    match = INSTRUCTION.match(line)
    if not match:
      continue
    result, op = match.groups()
    kind = op.removesuffix('-start')
    if kind in KINDS and not op.endswith('-done'):
      counts[kind] += 1
      sizes[kind] += array_bytes(result)
      seen[kind].append((array_bytes(result), result))
  entry = [line for line in entry_lines(text) if INSTRUCTION.match(line)]
  out: dict[str, Any] = {
      'collectives': {k: {'count': counts[k], 'mib': round(sizes[k] / 2**20, 2)}
                      for k in KINDS if counts[k]},
      'fusions_in_entry': sum(' fusion(' in line for line in entry),
      'entry_instructions': len(entry),
      'fusion_computations': len(re.findall(r'^%?fused_\w*|^%?[\w.]*fusion[\w.]* ', text, re.M)),
  }
  if shapes:
    out['shapes'] = {k: [f'{s}' for _, s in sorted(v, key=lambda x: -x[0])]
                     for k, v in seen.items()}
  return out


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('files', nargs='+', type=Path)
  parser.add_argument('--shapes', action='store_true')
  args = parser.parse_args(argv)
  print(json.dumps({str(f): summarize(f.read_text(), args.shapes) for f in args.files},
                   indent=1))


if __name__ == '__main__':
  main()
