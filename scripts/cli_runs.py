"""How the scripts (compare.py, the reproductions) run paxlike's CLI in a child process.

`START` starts it, as subprocess.Popen(argv, cwd=, env=, stdout=, stderr=): the test suite forks
the runs from a process that has imported paxlike already (tests/forked_cli.py) by setting it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import IO, Any, Callable, Iterator

REPO = Path(__file__).resolve().parents[1]
START: Callable[..., Any] = subprocess.Popen


def env() -> dict[str, str]:
  """This process's environment with the repository first on PYTHONPATH."""
  paths = os.environ.get('PYTHONPATH', '').split(os.pathsep)
  return {**os.environ, 'PYTHONPATH': os.pathsep.join(
      [str(REPO), *(p for p in paths if p and p != str(REPO))])}


@contextlib.contextmanager
def started(argv: list[str], stdout: IO, stderr: IO | int) -> Iterator[Any]:
  """`argv` started by START in the repository with `env()`, writing to the open files `stdout`
  and `stderr` (or subprocess.STDOUT); killed on leaving the block if it is still running."""
  proc = START(argv, cwd=REPO, env=env(), stdout=stdout, stderr=stderr)
  try:
    yield proc
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
