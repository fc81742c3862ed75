"""Shared benchmark helpers: the ≤2-in-flight timing loop, alternating A/B repeats, medians,
child processes that report JSON, and the one JSON line each benchmark prints.

Every benchmark here (not the peers' scripts in peers/) runs as a module from the repository
root (`python -m benchmarks.NAME`), so it imports `benchmarks.common` and this checkout's
paxlike with nothing put on `sys.path`; its children run the same way (`rerun`). Not a
benchmark itself.
Imports no JAX at module level, so a parent process stays light and its children choose
their own device count.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

REPO = Path(__file__).resolve().parents[1]

# What starts `run_children`'s processes: None, subprocess.Popen with stdout piped and stderr
# passed through; or (the test suite's runs) a stand-in with Popen's signature, called as
# START([sys.executable, *args], cwd=, env=, stdout=, stderr=) with stdout and stderr files
# opened by path, that forks the child from a process holding paxlike's imports
# (tests/forked_cli.py, ForkServer.popen) instead of starting a fresh interpreter.
START: Callable[..., Any] | None = None


def parser(doc: str | None, quick_help: str = 'tiny settings, for tests',
           quick_aliases: tuple[str, ...] = ()) -> argparse.ArgumentParser:
  """A benchmark's argument parser: its docstring's first line as the description, and the
  `--quick` flag every benchmark has (tiny shapes on any device: what the test suite runs)."""
  out = argparse.ArgumentParser(description=(doc or '').strip().split('\n')[0])
  out.add_argument('--quick', *quick_aliases, dest='quick', action='store_true', help=quick_help)
  return out


def log(message: str) -> None:
  """Progress and diagnostics go to stderr; stdout carries only the JSON result."""
  print(message, file=sys.stderr, flush=True)


def emit(result: dict[str, Any]) -> None:
  """Prints the benchmark's one JSON object on stdout."""
  print(json.dumps(result, sort_keys=False), flush=True)


def timed_loop(step: Callable[[], Any], n: int) -> float:
  """Seconds for `n` calls of `step()`, blocking on each call's output before the call after
  next is dispatched (≤ 2 steps in flight, as the trainer runs), and on the last at the end."""
  import jax
  start = time.perf_counter()
  previous = None
  for _ in range(n):
    out = step()
    if previous is not None:
      jax.block_until_ready(previous)
    previous = out
  jax.block_until_ready(previous)
  return time.perf_counter() - start


def alternate(runs: dict[str, Callable[[], float]], repeats: int) -> dict[str, list[float]]:
  """Calls every run once per repeat, in A B, B A, A B, ... order so that drifting machine load
  falls on both sides; returns each run's values in repeat order."""
  names = list(runs)
  values: dict[str, list[float]] = {name: [] for name in names}
  for r in range(repeats):
    for name in (names if r % 2 == 0 else names[::-1]):
      values[name].append(runs[name]())
      log(f'  repeat {r + 1}/{repeats} {name}: {values[name][-1]:.4g}')
  return values


def median(values: Sequence[float]) -> float:
  return float(statistics.median(values))


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float:
  """Median over repeats of numerator[i] / denominator[i] (pairs were measured back to back)."""
  return median([a / b for a, b in zip(numerator, denominator)])


def spread(values: Sequence[float]) -> float:
  """(max - min) / median: how noisy the repeats were."""
  return (max(values) - min(values)) / median(values) if values else 0.0


def peak_rss_mb() -> float:
  """This process's peak resident set size so far, in MiB (Linux reports KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_env(devices: int = 1, **extra: str) -> dict[str, str]:
  """The environment for a child that should see `devices` forced host (CPU) devices."""
  env = {**os.environ, **extra}
  flags = [f for f in env.get('XLA_FLAGS', '').split()
           if not f.startswith('--xla_force_host_platform_device_count')]
  env['XLA_FLAGS'] = ' '.join(flags + [f'--xla_force_host_platform_device_count={devices}'])
  path = env.get('PYTHONPATH')
  if not path or path.split(os.pathsep)[0] != str(REPO):  # Not twice: the same environment.
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [str(REPO), path]))
  return env


def rerun(spec: Any, *args: str) -> list[str]:
  """The `python` arguments that run the calling benchmark (`spec`: its module's `__spec__`)
  again with `args`: `-m NAME ARGS`, for `run_child` (whose children start in the repository
  root). SystemExit naming the command for a script run by its path, which has no spec."""
  if spec is None:
    raise SystemExit('a benchmark runs as a module from the repository root: '
                     'python -m benchmarks.NAME')
  return ['-m', spec.name, *args]


def run_child(args: Sequence[str], env: dict[str, str] | None = None,
              timeout: float = 1800) -> dict[str, Any]:
  """Runs `python ARGS` with stderr passed through, and returns the JSON object that is the
  last line of its stdout. Raises RuntimeError (with its exit code) if it fails."""
  return run_children([args], env, timeout)[0]


def run_children(commands: Sequence[Sequence[str]], env: dict[str, str] | None = None,
                 timeout: float = 1800) -> list[dict[str, Any]]:
  """`run_child` for several commands at once (all running together: use it only where the
  children measure something other than time, such as memory)."""
  if START is not None:
    return _run_started(commands, env or child_env(), timeout)
  procs = [subprocess.Popen([sys.executable, *args], cwd=REPO, env=env or child_env(),
                            stdout=subprocess.PIPE, text=True) for args in commands]
  results = []
  for args, proc in zip(commands, procs):
    out, _ = proc.communicate(timeout=timeout)
    results.append(_result(args, proc.returncode, out))
  return results


def _run_started(commands: Sequence[Sequence[str]], env: dict[str, str], timeout: float
                 ) -> list[dict[str, Any]]:
  """`run_children` through START: each child writes to files, its stderr copied to ours when
  it exits."""
  with tempfile.TemporaryDirectory(prefix='paxlike_bench_') as tmp:
    files = [(open(Path(tmp) / f'{i}.out', 'w'), open(Path(tmp) / f'{i}.err', 'w'))
             for i in range(len(commands))]
    procs = [START([sys.executable, *args], cwd=REPO, env=env, stdout=out, stderr=err)
             for args, (out, err) in zip(commands, files)]
    results = []
    for args, proc, (out, err) in zip(commands, procs, files):
      returncode = proc.wait(timeout=timeout)
      out.close()
      err.close()
      sys.stderr.write(Path(err.name).read_text())
      sys.stderr.flush()
      results.append(_result(args, returncode, Path(out.name).read_text()))
    return results


def _result(args: Sequence[str], returncode: int, out: str) -> dict[str, Any]:
  """The JSON object on the last line of a child's stdout; RuntimeError if it failed."""
  lines = out.strip().splitlines()
  if returncode != 0 or not lines:
    raise RuntimeError(f'{" ".join(args)} exited {returncode}')
  return json.loads(lines[-1])


def machine() -> dict[str, Any]:
  """What the numbers were measured on: cores and the load average at the start."""
  return {'cpu_count': os.cpu_count(), 'load_avg_1m': round(os.getloadavg()[0], 2)}


def profile_op_ms(fn: Callable[[], Any], directory: Path, top: int = 8) -> dict[str, float]:
  """Runs `fn()` (blocking on its result) under `jax.profiler.trace` into `directory`, and
  returns the XLA op time in ms by op kind (the fusion name without its number), summed over
  threads, the `top` largest plus `total`. Open the trace in Perfetto or TensorBoard for more."""
  import jax
  with jax.profiler.trace(str(directory), create_perfetto_trace=True):
    jax.block_until_ready(fn())
  path = max(Path(directory).rglob('*.trace.json.gz'), key=lambda p: p.stat().st_mtime)
  trace = json.loads(gzip.open(path).read())
  kinds: collections.Counter = collections.Counter()
  for event in trace['traceEvents'] if isinstance(trace, dict) else trace:
    name = event.get('name', '')
    if (event.get('ph') != 'X' or name.startswith(('$', 'PjitFunction')) or '::' in name
        or 'ThreadPool' in name):
      continue  # Python frames, dispatch and executor bookkeeping, not ops.
    kinds[re.sub(r'[.\d]+$', '', name)] += event.get('dur', 0) / 1e3
  out = {kind: round(ms, 1) for kind, ms in kinds.most_common(top)}
  out['total'] = round(sum(kinds.values()), 1)
  return out

