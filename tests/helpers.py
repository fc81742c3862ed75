"""Shared test helpers: run the CLI in a process of its own, read metrics rows."""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from tests.forked_cli import ForkedProcess, ForkServer, import_key


REPO = Path(__file__).resolve().parents[1]
# A few-second LM run: one layer, 20 steps, checkpoints every 10, on batches a quarter of the
# experiment's (8 rows of 64 bytes: still a whole number of rows on 8 devices) and 2 eval batches.
TINY = ['--exp=lm.StdlibTiny', '--fdl_fiddler=tiny', '--fdl_set=data.batch_size=8',
        '--fdl_set=data.seq_len=64', '--fdl_set=data.num_eval_batches=2']


def cli_env(devices: int = 1, optimized: bool = False, **extra: str) -> dict[str, str]:
  """The environment of a CLI subprocess on `devices` forced CPU devices, keeping the suite's
  XLA flags (conftest.py), less its -O0 when `optimized` (long runs, where compiling is not
  the cost)."""
  env = {**os.environ, 'PYTHONPATH': str(REPO), **extra}
  kept = [f for f in os.environ.get('XLA_FLAGS', '').split()
          if not f.startswith('--xla_force_host_platform_device_count')
          and not (optimized and f.startswith('--xla_backend_optimization_level'))]
  env['XLA_FLAGS'] = ' '.join([*kept, f'--xla_force_host_platform_device_count={devices}'])
  return env


def run_cli(*args: str, devices: int = 1, timeout: float = 300, check: bool = True,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
  """`python -m paxlike.main ARGS` (see `run_python`), capturing text output; asserts exit 0
  when `check`."""
  proc = run_python(['-m', 'paxlike.main', *args], env or cli_env(devices), timeout)
  if check:
    assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


def run_python(args: list[str], env: dict[str, str], timeout: float
               ) -> subprocess.CompletedProcess:
  """`python ARGS` in REPO, capturing text output: forked from the worker's fork server
  (tests/forked_cli.py) when it can be, else started afresh."""
  proc = _fork_server(env).run(args, env, timeout)
  if proc is None:
    proc = subprocess.run([sys.executable, *args], cwd=REPO, text=True, capture_output=True,
                          timeout=timeout, env=env)
  return proc


# `python SCRIPT ARGS` as a `-c` the fork server runs: the script's directory first on sys.path.
_SCRIPT = """
import runpy, sys
sys.argv = {argv!r}
sys.path.insert(0, {directory!r})
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def script_code(path: str | Path, *args: str) -> str:
  """`python PATH ARGS` as the `-c SCRIPT` a fork server runs (_SCRIPT)."""
  path = os.path.abspath(path)
  return _SCRIPT.format(argv=[path, *args], directory=os.path.dirname(path))


# `python -m MODULE ARGS` (from the repository root) as a `-c` the fork server runs.
_MODULE = """
import runpy, sys
sys.argv = {argv!r}
runpy.run_module({module!r}, run_name='__main__', alter_sys=True)
"""


def module_code(module: str, *args: str) -> str:
  """`python -m MODULE ARGS` as the `-c SCRIPT` a fork server runs (_MODULE)."""
  return _MODULE.format(argv=[module, *args], module=module)


# Put before a benchmark's module_code: its own `python -m CHILD ARGS` and `python -c CODE`
# children (benchmarks/common.py START) are forked in turn, from a server forked from it first
# (ForkServer.here), instead of each importing paxlike again. Not for a benchmark that times a
# child's start-up (benchmarks/startup.py) or reads its children's CPU (benchmarks/cpu_step.py).
_FORKING_CHILDREN = """
from benchmarks import common
from tests.forked_cli import ForkServer
from tests.helpers import module_code
server = ForkServer.here()

def start(argv, **kwargs):
  if argv[1] == '-m':  # python -m CHILD ARGS: as the `-c` the server runs.
    argv = [argv[0], '-c', module_code(*argv[2:])]
  return server.popen(argv, **kwargs)

common.START = start
"""


def run_file(script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 600
             ) -> subprocess.CompletedProcess:
  """`python SCRIPT ARGS` for a repository script (SCRIPT relative to REPO), forked from the
  worker's fork server like `run_python`'s runs, capturing text output."""
  return run_python(['-c', script_code(REPO / script, *args)], env or cli_env(1), timeout)


def run_module(module: str, *args: str, env: dict[str, str] | None = None, timeout: float = 600,
               fork_children: bool = False) -> subprocess.CompletedProcess:
  """`python -m MODULE ARGS` from the repository root (a benchmark: `benchmarks.NAME`), forked
  as `run_file`'s runs are; with `fork_children`, a benchmark whose children are forked too
  (_FORKING_CHILDREN)."""
  code = module_code(module, *args)
  return run_python(['-c', _FORKING_CHILDREN + code if fork_children else code],
                    env or cli_env(1), timeout)


def start_cli(*args: str, devices: int = 1, env: dict[str, str] | None = None,
              stdout: str | Path = os.devnull, stderr: str | Path = os.devnull
              ) -> ForkedProcess | subprocess.Popen:
  """`python -m paxlike.main ARGS` started in the background, writing to the files `stdout` and
  `stderr` (see `start_python`). A Popen-like handle, to poll, signal or SIGKILL."""
  return start_python(['-m', 'paxlike.main', *args], env or cli_env(devices), stdout, stderr)


def start_python(args: list[str], env: dict[str, str], stdout: str | Path = os.devnull,
                 stderr: str | Path = os.devnull, new_session: bool = False
                 ) -> ForkedProcess | subprocess.Popen:
  """`python ARGS` started in the background in REPO, writing to the files `stdout` and
  `stderr` (the same path: one file, as with stderr=subprocess.STDOUT), in a session of its own
  when `new_session` (Popen's start_new_session): forked from the worker's fork server when it
  can be (see `run_python`), else started afresh. A Popen-like handle."""
  proc = _fork_server(env).start(args, env, stdout, stderr, new_session=new_session)
  if proc is None:
    with open(stdout, 'w') as out:
      if str(stderr) == str(stdout):
        return subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=new_session)
      with open(stderr, 'w') as err:
        proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=out,
                                stderr=err, start_new_session=new_session)
  return proc


# This process's fork servers, by the import-time part of their environment (forked_cli.
# import_key), the most recently used last.
_SERVERS: dict[frozenset, ForkServer] = {}
MAX_SERVERS = 3


def _fork_server(env: dict[str, str]) -> ForkServer:
  """A fork server that can serve runs in `env`: one per import-time environment, started on
  first use (and again if it died), so that a test that sets such a variable of its own
  (XDG_CACHE_HOME, say) neither goes without one nor leaves the others' runs unservable. Past
  MAX_SERVERS the least recently used one is closed."""
  key = import_key(env)
  server = _SERVERS.pop(key, None)
  if server is None or not server.alive():
    server = ForkServer(env)
    atexit.register(server.close)
  _SERVERS[key] = server
  while len(_SERVERS) > MAX_SERVERS:
    _SERVERS.pop(next(iter(_SERVERS))).close()
  return server


def run_script(script: str, devices: int = 8, timeout: float = 300) -> str:
  """Runs `python -c script` on `devices` forced CPU devices (forked like run_cli's runs); its
  stdout, after asserting exit 0."""
  proc = run_python(['-c', script], cli_env(devices, JAX_PLATFORMS='cpu'), timeout)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return proc.stdout


def snapshot(directory: Path) -> dict[str, str]:
  """Path → content hash of every file under `directory`: to show nothing changed."""
  return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(directory.rglob('*')) if p.is_file()}


# The timing fields the trainer writes (`steps_per_sec` and `throughput.throughput_metrics`), the
# only ones a determinism comparison may skip. Named one by one: any other field, including a new
# one, is compared, so a field that varies between identical runs fails a test instead of
# silently leaving every comparison. Each obeys the job dir's naming rule (DESIGN.md: a timing
# field's name contains per_sec, time, mfu, flops or eta).
TIMING_FIELDS = frozenset({'steps_per_sec', 'data_wait_time_fraction', 'tokens_per_sec',
                           'examples_per_sec', 'tflops_per_sec', 'mfu'})


def metric_rows(job_dir: Path, timing: bool = False) -> list[dict]:
  """metrics.jsonl rows, without the TIMING_FIELDS unless asked."""
  rows = [json.loads(line) for line in (Path(job_dir) / 'metrics.jsonl').read_text().splitlines()]
  return rows if timing else [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rows]


def committed_steps(job_dir: Path) -> list[int]:
  """The steps of the job dir's committed checkpoints (Orbax's finalized step dirs)."""
  ckpt = Path(job_dir) / 'checkpoints'
  return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.exists() else []


def kill_after_first_checkpoint(*args: str, job_dir: Path, devices: int = 1,
                                timeout: float = 240) -> list[int]:
  """Starts `python -m paxlike.main ARGS --job_log_dir=JOB_DIR`, SIGKILLs it as soon as a
  checkpoint is committed, and returns the committed steps (asserting it was killed, not done)."""
  proc = start_cli(*args, f'--job_log_dir={job_dir}', devices=devices)
  deadline = time.monotonic() + timeout
  while proc.poll() is None and time.monotonic() < deadline and not committed_steps(job_dir):
    time.sleep(0.01)
  proc.kill()
  proc.wait(timeout=60)
  assert proc.returncode == -signal.SIGKILL, 'the run ended before the kill'
  return committed_steps(job_dir)


def assert_verdict(got: tuple[str, list[str]], verdict: str, failed: str | None) -> None:
  """A reproduction's (verdict, failed conditions) is `verdict`, with no failed condition when
  `failed` is None, else exactly one, naming `failed`."""
  result, reasons = got
  assert result == verdict
  if failed is None:
    assert reasons == []
  else:
    assert len(reasons) == 1 and failed in reasons[0]


def made_once(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:
  """The directory `name`, made by `make(path)` once per pytest run and shared by its xdist
  workers (a module fixture runs once per worker, so two workers would each make it). The
  first worker to ask makes it under a file lock; the others wait and reuse it. For fixtures
  that tests only read (or copy before changing)."""
  root = tmp_path_factory.getbasetemp()
  if os.environ.get('PYTEST_XDIST_WORKER'):
    root = root.parent  # The run's directory, above every worker's own.
  path = root / 'made_once' / name
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path.parent / f'{name}.lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    done = path.parent / f'{name}.done'
    if not done.exists():  # Not made yet, or a worker's attempt failed: (re)make it.
      shutil.rmtree(path, ignore_errors=True)
      make(path)
      done.touch()
  return path
