"""Runs the TPU test folder (tests/tpu) with pytest in this process and prints its outcome as one
JSON object: counts per outcome and, per failed test, its last error line.

    python -m benchmarks.tpu_tests [PYTEST_ARGS...]     # tests/tpu unless a path is given

Only tests/tpu's own conftest is loaded (`--confcutdir`), not the CPU suite's (its data root and
compilation settings), so this needs pytest and paxlike's dependencies, nothing of the suite's.
Without pytest it prints a `skipped` object (pytest is not on a TPU machine's index: carry it
in the wheels). Without a TPU every test is skipped. Exit code: 0 when nothing failed.
"""

from __future__ import annotations

import collections
import sys
import time

from benchmarks import common


class Outcomes:
  """A pytest plugin that keeps each test's outcome and its failure's last line."""

  def __init__(self) -> None:
    self.counts: collections.Counter = collections.Counter()
    self.failures: dict[str, str] = {}

  def pytest_runtest_logreport(self, report) -> None:
    if report.when == 'call' or report.outcome != 'passed':
      self.counts[report.outcome] += 1
      common.log(f'tpu_tests: {report.nodeid} {report.outcome} ({report.duration:.1f} s)')
    if report.failed:
      text = str(report.longrepr).strip().splitlines()
      self.failures[f'{report.nodeid} ({report.when})'] = text[-1][-300:] if text else ''


def main(argv: list[str]) -> int:
  out = {'benchmark': 'tpu_tests'}
  try:
    import pytest
  except ImportError:
    common.emit({**out, 'skipped': 'pytest is not importable here (add it to the wheels)'})
    return 0
  import jax
  out['platform'] = jax.devices()[0].platform
  plugin = Outcomes()
  began = time.time()
  paths = [a for a in argv if not a.startswith('-')]
  args = argv if paths else [*argv, str(common.REPO / 'tests' / 'tpu')]
  stdout, sys.stdout = sys.stdout, sys.stderr  # pytest's report goes to stderr; JSON to stdout.
  try:
    code = pytest.main(['-q', '-p', 'no:cacheprovider', '-o', 'addopts=',
                        f'--confcutdir={common.REPO / "tests" / "tpu"}', *args], plugins=[plugin])
  finally:
    sys.stdout = stdout
  out.update(exit_code=int(code), seconds=round(time.time() - began, 1),
             **{k: plugin.counts[k] for k in ('passed', 'failed', 'skipped')},
             failures=plugin.failures)
  common.emit(out)
  return 0 if int(code) in (0, 5) and not plugin.failures else 1


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
