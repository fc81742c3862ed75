"""Plot one metric from any number of paxlike `metrics.jsonl` files into a PNG.

    python scripts/plot_metrics.py OUT.png RUN1/metrics.jsonl RUN2/metrics.jsonl [--key eval_loss]
        [--x step] [--labels a,b] [--logx] [--title TEXT]

Each file is one line, labelled by its job dir's name (or `--labels`); rows without the key
are skipped. Uses matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Iterable, Sequence

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

Series = tuple[str, list[float], list[float]]


def read_rows(path: Path) -> list[dict]:
  """The well-formed rows of a metrics.jsonl (a row cut short by a kill is skipped)."""
  rows = []
  for line in Path(path).read_text().splitlines():
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:
      continue
  return rows


def series(rows: Iterable[dict], key: str, x: str = 'step') -> tuple[list[float], list[float]]:
  """(xs, ys) of the rows that have both `x` and `key`."""
  points = [(r[x], r[key]) for r in rows if key in r and x in r]
  return [p[0] for p in points], [p[1] for p in points]


def default_labels(paths: Sequence[Path]) -> list[str]:
  """Each file's job dir name; the whole path where names repeat."""
  names = [Path(p).resolve().parent.name for p in paths]
  return names if len(set(names)) == len(names) else [str(p) for p in paths]


def plot(lines: Sequence[Series], out: Path, xlabel: str, ylabel: str, title: str = '',
         logx: bool = False, hlines: Sequence[tuple[str, float]] = ()) -> Path:
  """Writes `lines` (label, xs, ys) and horizontal reference lines (label, y) to `out`."""
  fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
  for label, xs, ys in lines:
    ax.plot(xs, ys, marker='o', markersize=3, label=label)
  for label, y in hlines:
    ax.axhline(y, linestyle='--', color='gray', label=label)
  if logx:
    ax.set_xscale('log')
  ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
  ax.grid(alpha=0.3)
  if lines or hlines:
    ax.legend(fontsize=8)
  fig.tight_layout()
  out = Path(out)
  out.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out)
  plt.close(fig)
  return out


def plot_files(paths: Sequence[Path], out: Path, key: str = 'eval_loss', x: str = 'step',
               labels: Sequence[str] | None = None, logx: bool = False, title: str = '') -> Path:
  """One line per metrics.jsonl file; raises ValueError if no file has the key."""
  labels = list(labels) if labels else default_labels(paths)
  if len(labels) != len(paths):
    raise ValueError(f'{len(labels)} labels for {len(paths)} files')
  lines = [(label, *series(read_rows(p), key, x)) for label, p in zip(labels, paths)]
  if not any(xs for _, xs, _ in lines):
    raise ValueError(f'no row in {", ".join(map(str, paths))} has both {x!r} and {key!r}')
  return plot(lines, out, x, key, title or f'{key} vs {x}', logx)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('out', type=Path, help='the PNG to write')
  parser.add_argument('files', type=Path, nargs='+', help='metrics.jsonl files')
  parser.add_argument('--key', default='eval_loss')
  parser.add_argument('--x', default='step')
  parser.add_argument('--labels', help='comma-separated, one per file')
  parser.add_argument('--logx', action='store_true')
  parser.add_argument('--title', default='')
  args = parser.parse_args(argv)
  missing = [str(p) for p in args.files if not p.is_file()]
  if missing:
    print(f'plot_metrics: error: no such file: {", ".join(missing)}', file=sys.stderr)
    return 2
  try:
    plot_files(args.files, args.out, args.key, args.x,
               args.labels.split(',') if args.labels else None, args.logx, args.title)
  except ValueError as error:
    print(f'plot_metrics: error: {error}', file=sys.stderr)
    return 2
  print(args.out)
  return 0


if __name__ == '__main__':
  sys.exit(main())
