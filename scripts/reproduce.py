"""Reproduces one paper's headline result at small scale through paxlike's trainer.

  python scripts/reproduce.py NAME [--quick] [--out DIR] [--work DIR [--reuse]]
  python scripts/reproduce.py --list

Writes DIR/NAME.md (default docs/reproductions/; a `--quick` run defaults to a temporary
directory so that it never replaces a page) with its plot NAME.png beside it, and prints one
JSON line: {"reproduction", "verdict", "quick", "page", "plot", "seconds", ...key numbers}.
Progress goes to stderr. The reproductions live in scripts/reproductions/, one module each.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reproductions import NAMES, page, trainer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('name', nargs='?', choices=NAMES, help='the reproduction to run')
  parser.add_argument('--list', action='store_true', help='list the reproductions and exit')
  parser.add_argument('--quick', action='store_true', help='the seconds-long test version')
  parser.add_argument('--out', type=Path, help='where the page and plot go')
  parser.add_argument('--work', type=Path, help='where the training job dirs go (a new temp '
                      'dir by default)')
  parser.add_argument('--reuse', action='store_true', help="read the runs a previous call "
                      "finished in --work instead of training them again (to redo a page)")
  args = parser.parse_args(argv)
  if not args.list and args.name is None:
    parser.error('name a reproduction, or pass --list')
  if args.reuse and not args.work:
    parser.error('--reuse needs the --work of the run to reuse')
  return args


def out_dir(args: argparse.Namespace) -> Path:
  """--out; else docs/reproductions for a full run, and a new temp dir for a quick one (its
  numbers mean nothing: it must never replace a page)."""
  if args.out:
    return args.out
  if args.quick:
    return Path(tempfile.mkdtemp(prefix=f'reproduce-{args.name}-'))
  return REPO / 'docs' / 'reproductions'


def preload(argv: list[str]) -> None:
  """Imports the named reproduction's module and its RUN_IMPORTS: what its training runs import
  beyond the CLI's own modules (dp: dp_accounting, with scipy, ~1 s a run), for a caller that
  then forks the runs from this process (tests/forked_cli.py's ForkServer.here), so that each
  run has them already. Modules this process imports anyway; it starts no thread."""
  args = parse(argv)
  if args.name is not None:
    module = importlib.import_module(f'reproductions.{args.name}')
    for name in getattr(module, 'RUN_IMPORTS', ()):
      importlib.import_module(name)


def main(argv: list[str]) -> int:
  args = parse(argv)
  if args.list:
    for name in NAMES:
      module = importlib.import_module(f'reproductions.{name}')
      print(f'{name}\t{module.TITLE}')
    return 0
  module = importlib.import_module(f'reproductions.{args.name}')
  out = out_dir(args)
  work = args.work or Path(tempfile.mkdtemp(prefix=f'reproduce-{args.name}-jobs-'))
  trainer.REUSE['on'] = args.reuse
  start = time.monotonic()
  report = module.run(args.quick, work)
  seconds = trainer.SPENT['seconds'] if args.reuse else time.monotonic() - start
  command = f'python scripts/reproduce.py {args.name}' + (' --quick' if args.quick else '')
  paths = page.write(report, out, command, seconds, args.quick)
  print(json.dumps({'reproduction': args.name, 'verdict': report.verdict, 'quick': args.quick,
                    **paths, 'seconds': round(seconds, 1), **report.numbers}), flush=True)
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
