"""Training runs for the reproductions: paxlike's own CLI (`python -m paxlike.main --exp=NAME
--fdl_set=...`) in a child process, its metrics.jsonl rows read back, and a run stopped early
(killed) once a row meets a condition, e.g. the target accuracy of a rounds-to-target table."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import cli_runs

REPO = cli_runs.REPO
Row = dict[str, Any]
REUSE = {'on': False}  # scripts/reproduce.py --reuse: read finished runs instead of training.
SPENT = {'seconds': 0.0}  # Training time of this process's runs (reused ones: as recorded).


def log(message: str) -> None:
  """Progress goes to stderr; stdout carries only the reproduction's JSON line."""
  print(message, file=sys.stderr, flush=True)


def read_rows(path: Path) -> list[Row]:
  """The complete rows of a metrics.jsonl (a line still being written is skipped)."""
  if not path.exists():
    return []
  rows = []
  for line in path.read_text().splitlines():
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError:
      continue
  return rows


def command(exp: str, job: Path, overrides: Mapping[str, Any]) -> list[str]:
  """The CLI call that trains `exp` in `job` with `--fdl_set=PATH=VALUE` per override."""
  return [sys.executable, '-m', 'paxlike.main', f'--exp={exp}', f'--job_log_dir={job}',
          *(f'--fdl_set={path}={value}' for path, value in overrides.items())]


def train(exp: str, job: Path, overrides: Mapping[str, Any],
          stop: Callable[[Row], bool] | None = None, timeout: float = 1800) -> list[Row]:
  """Trains `exp` (with `overrides`) in the new job dir `job`; its metrics rows. With `stop`,
  the run is killed as soon as a row satisfies it (the rows up to it are kept). With
  `REUSE['on']`, a job dir this function finished before is read instead (to redo a page)."""
  job = Path(job)
  done = job.parent / f'{job.name}.done'
  if REUSE['on'] and done.exists():
    SPENT['seconds'] += json.loads(done.read_text())['seconds']
    rows = read_rows(job / 'metrics.jsonl')
    hit = next((i for i, row in enumerate(rows) if stop and stop(row)), len(rows) - 1)
    return rows[:hit + 1]
  log(f'training {job.name} ({exp})')
  if job.exists():
    raise FileExistsError(f'{job} exists: each reproduction run needs a new job dir')
  job.parent.mkdir(parents=True, exist_ok=True)
  start = time.monotonic()
  with (open(job.parent / f'{job.name}.log', 'w') as out,
        cli_runs.started(command(exp, job, overrides), out, subprocess.STDOUT) as proc):
    rows = _watch(proc, job / 'metrics.jsonl', stop, time.monotonic() + timeout)
  if rows is None:
    tail = (job.parent / f'{job.name}.log').read_text()[-2000:]
    raise RuntimeError(f'training {exp} in {job} failed (exit {proc.returncode}):\n{tail}')
  seconds = time.monotonic() - start
  SPENT['seconds'] += seconds
  done.write_text(json.dumps({'command': command(exp, job, overrides), 'seconds': seconds}))
  return rows


def cli_output(args: Sequence[str], out: Path, timeout: float = 600) -> str:
  """The stdout of `python -m paxlike.main ARGS` (a `--mode=decode` run, say), kept in the file
  `out`; with `REUSE['on']`, that file when a previous call wrote it (nothing runs again)."""
  out = Path(out)
  if REUSE['on'] and out.exists():
    return out.read_text()
  argv = [sys.executable, '-m', 'paxlike.main', *args]
  partial = out.with_name(out.name + '.partial')
  with (open(partial, 'w') as stdout, open(out.with_suffix('.log'), 'w') as stderr,
        cli_runs.started(argv, stdout, stderr) as proc):
    code = proc.wait(timeout)
  if code != 0:
    tail = out.with_suffix('.log').read_text()[-2000:]
    raise RuntimeError(f'{" ".join(args)} failed (exit {code}):\n{tail}')
  partial.replace(out)
  return out.read_text()


def _watch(proc: subprocess.Popen, metrics: Path, stop: Callable[[Row], bool] | None,
           deadline: float) -> list[Row] | None:
  """Polls the run's rows until it exits (its rows; None if it failed) or a row meets
  `stop` (the rows up to that one; the caller kills the run)."""
  while True:
    finished = proc.poll() is not None
    rows = read_rows(metrics)
    hit = next((i for i, row in enumerate(rows) if stop and stop(row)), None)
    if hit is not None:
      return rows[:hit + 1]
    if finished:
      return rows if proc.returncode == 0 else None
    if time.monotonic() > deadline:
      raise TimeoutError(f'{metrics.parent} ran past its time limit')
    time.sleep(0.2)


def first_step(rows: Sequence[Row], key: str, target: float) -> int | None:
  """The first step whose `key` is at least `target` (None: never)."""
  return next((row['step'] for row in rows if row.get(key, -float('inf')) >= target), None)


def series(rows: Sequence[Row], key: str) -> tuple[list[int], list[float]]:
  """(steps, values) of the rows that have `key`."""
  points = [(row['step'], row[key]) for row in rows if key in row]
  return [s for s, _ in points], [v for _, v in points]


def rounds_to(rows: Sequence[Row], key: str, targets: Sequence[float]) -> dict[float, int | None]:
  """The first step at or above each target (None: never)."""
  return {t: first_step(rows, key, t) for t in targets}


def fastest(candidates: Sequence[dict], targets: Sequence[float]) -> dict:
  """The candidate run ({'rounds': rounds_to(...), ...}) that reaches the highest target
  first; among those that never do, the one first to the next target down, and so on."""
  order = sorted(targets, reverse=True)
  return min(candidates, key=lambda c: tuple(
      (c['rounds'][t] is None, c['rounds'][t] or 0) for t in order))
