"""A reproduction's page, docs/reproductions/NAME.md, and its plot NAME.png beside it.

Every page has the same sections, in order (tests/test_reproduce.py checks them): the verdict,
the paper's claim, the setting (theirs and ours), the results table, the plot, and why the
verdict is what it is.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Sequence

VERDICTS = ('reproduced', 'partly', 'not')
SECTIONS = ('## Verdict', "## The paper's claim", '## Setting', '## Results', '## Plot',
            '## Why')


@dataclasses.dataclass
class Report:
  """What a reproduction found. `summary`: one line beside the verdict; `tables`: (caption,
  header, rows) each; `plot(figure)` draws the figure; `numbers`: the key numbers, also
  printed in the JSON line."""

  name: str
  title: str
  paper: str
  claim: str
  setting: str
  verdict: str
  summary: str
  why: str
  tables: list[tuple[str, Sequence[str], Sequence[Sequence[Any]]]]
  numbers: dict[str, Any]
  plot: Callable[[Any], None] | None = None

  def __post_init__(self):
    if self.verdict not in VERDICTS:
      raise ValueError(f'verdict must be one of {VERDICTS}, got {self.verdict!r}')


def cell(value: Any) -> str:
  """A table cell: floats to 4 significant digits, None as '–'."""
  if value is None:
    return '–'
  if isinstance(value, float):
    return f'{value:.4g}'
  return str(value)


def table(caption: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  """A markdown table under its caption."""
  lines = [caption, '', '| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  lines += ['| ' + ' | '.join(cell(v) for v in row) + ' |' for row in rows]
  return '\n'.join(lines)


def draw(report: Report, path: Path) -> str | None:
  """Writes the plot to `path`; None, or why there is no plot."""
  if report.plot is None:
    return 'this reproduction has no plot'
  try:
    import matplotlib
  except ImportError:
    return 'matplotlib is not installed in this environment: the table above is the result'
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  figure = plt.figure(figsize=(10, 4), dpi=100)
  try:
    report.plot(figure)
    figure.tight_layout()
    figure.savefig(path)
  finally:
    plt.close(figure)
  return None


def write(report: Report, out: Path, command: str, seconds: float, quick: bool) -> dict:
  """Writes NAME.md (and NAME.png) into `out`; their paths."""
  out.mkdir(parents=True, exist_ok=True)
  png = out / f'{report.name}.png'
  missing = draw(report, png)
  mode = ('a `--quick` run: the test version, tiny, not the result' if quick else
          'the full run, on 2 CPU cores shared with other jobs')
  parts = [
      f'# {report.name}: {report.title}', '',
      f'Made by `{command}` ({mode}; it took {seconds / 60:.1f} min of wall time).', '',
      SECTIONS[0], '', f'**{report.verdict}**: {report.summary}', '',
      SECTIONS[1], '', report.paper, '', report.claim, '',
      SECTIONS[2], '', report.setting, '',
      SECTIONS[3], '', *('\n\n'.join(table(*t) for t in report.tables).splitlines()), '',
      SECTIONS[4], '', f'![{report.name}]({png.name})' if missing is None else missing, '',
      SECTIONS[5], '', report.why, '']
  md = out / f'{report.name}.md'
  md.write_text('\n'.join(parts))
  return {'page': str(md), 'plot': None if missing else str(png)}
