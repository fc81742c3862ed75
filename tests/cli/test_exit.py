"""How the command ends: a run that succeeds exits 0 at once, after its atexit handlers and with
its output flushed; a failing one keeps its exit code."""

import subprocess
import sys

from tests.helpers import REPO, cli_env

# The command as its console script runs it, with an atexit handler of the run's own.
PROGRAM = """
import atexit, sys
atexit.register(lambda: print('atexit ran', file=sys.stderr, flush=True))
sys.argv = ['paxlike', *sys.argv[1:]]
from paxlike.main import run_cli
run_cli()
"""


def run(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-c', PROGRAM, *args], cwd=REPO, text=True,
                        capture_output=True, timeout=120, env=cli_env(1))


def test_a_run_that_succeeds_flushes_runs_its_atexit_handlers_and_exits_0():
  done = run('--exp=lm.StdlibTiny', '--mode=print_config')
  assert done.returncode == 0, done.stderr[-2000:]
  assert 'num_layers' in done.stdout  # Flushed though the process never tore down.
  assert done.stderr.rstrip().endswith('atexit ran')


def test_a_run_that_fails_keeps_its_exit_code():
  assert run('--exp=lm.NoSuchExperiment', '--mode=print_config').returncode == 2
  assert run('--no_such_flag').returncode == 2
