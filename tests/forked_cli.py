"""A fork server for the suite's `python -m paxlike.main ARGS` and `python -c SCRIPT` runs.

Each test worker keeps one server process that has imported the command line and what a run
imports, without starting a jax backend, so that XLA_FLAGS (the device count) stay each run's own.
The server forks one child per run. The child is still a process of its own: its exit code,
signals, os._exit and file descriptors are as they would be. It only skips the ~2 s of imports that
every run would otherwise pay again, and the interpreter's teardown: the child ends with os._exit,
as paxlike's own error exits do, so atexit handlers do not run (the trainer closes its
checkpoints and summaries itself before it returns).

A run whose environment differs from the server's in a variable read at import time (say
PYTHONPATH, or JAX_* config) cannot be served. `ForkServer.run` then returns None, and the caller
starts a plain subprocess.

Protocol, one JSON line each way on the server's stdin/stdout: a request {args, env, cwd, stdout,
stderr} (args as after `python`; the last two are file paths), then the replies {"pid": N} and
{"status": exit code}.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import traceback
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What a training, eval or decode run imports.
PRELOAD = ('paxlike.main', 'paxlike.trainer.loop', 'paxlike.trainer.build', 'paxlike.trainer.restore',
           'paxlike.cli.decode_text', 'paxlike.data.prepare', 'tensorflow_datasets')
# Variables a run reads when it runs, not when its modules are imported: these may differ
# between the server and a run it serves (the child hands JAX_PLATFORMS to jax's config, which
# read it at import).
RUNTIME_ENV = ('XLA_FLAGS', 'PAXLIKE_', 'PYTEST_', 'JAX_PLATFORMS')


def servable(server_env: dict[str, str], env: dict[str, str]) -> bool:
  """Whether a run in `env` can be forked from a server started in `server_env`."""
  changed = {k for k in server_env.keys() | env.keys() if server_env.get(k) != env.get(k)}
  return all(k.startswith(RUNTIME_ENV) for k in changed)


def runnable(args: list[str]) -> bool:
  """Whether `python ARGS` is a run the server makes: `-m paxlike.main ...` or `-c SCRIPT`."""
  return args[:2] == ['-m', 'paxlike.main'] or (len(args) == 2 and args[0] == '-c')


class ForkServer:
  """One server process; `run(args, ...)` is `subprocess.run([python, *args], ...)`."""

  def __init__(self, env: dict[str, str]):
    self.env = dict(env)
    self.proc = subprocess.Popen([sys.executable, '-m', 'tests.forked_cli'], cwd=REPO, env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

  def alive(self) -> bool:
    return self.proc.poll() is None

  def run(self, args: list[str], env: dict[str, str], timeout: float
          ) -> subprocess.CompletedProcess | None:
    """The finished `python ARGS` run, as subprocess.run(capture_output=True, text=True)
    returns it (raising TimeoutExpired after killing it past `timeout`); None if this server
    cannot make it (see `runnable` and `servable`)."""
    if not (self.alive() and runnable(args) and servable(self.env, env)):
      return None
    with tempfile.TemporaryDirectory(prefix='forked_cli') as tmp:
      out, err = Path(tmp) / 'stdout', Path(tmp) / 'stderr'
      self.proc.stdin.write(json.dumps({'args': args, 'env': env, 'cwd': str(REPO),
                                        'stdout': str(out), 'stderr': str(err)}) + '\n')
      self.proc.stdin.flush()
      pid = self._reply(timeout=60)['pid']
      try:
        status = self._reply(timeout)['status']
      except subprocess.TimeoutExpired:
        os.kill(pid, signal.SIGKILL)
        self._reply(timeout=60)
        raise subprocess.TimeoutExpired([sys.executable, *args], timeout, out.read_text(),
                                        err.read_text()) from None
      return subprocess.CompletedProcess([sys.executable, *args], status, out.read_text(),
                                         err.read_text())

  def _reply(self, timeout: float) -> dict:
    ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
    if not ready:
      raise subprocess.TimeoutExpired('forked paxlike.main', timeout)
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f'the fork server exited ({self.proc.poll()})')
    return json.loads(line)

  def close(self) -> None:
    self.proc.stdin.close()
    self.proc.wait(timeout=30)


def _child(request: dict, replies: int) -> None:
  """In the forked child: become `python ARGS` (`-m paxlike.main ...` or `-c SCRIPT`) with the
  request's environment and output files, and exit with its code."""
  code = 1
  try:
    os.close(replies)
    os.chdir(request['cwd'])
    os.environ.clear()
    os.environ.update(request['env'])
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, request['stdout']), (2, request['stderr'])):
      os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own defaults.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.modules['jax'].config.update('jax_platforms', os.environ.get('JAX_PLATFORMS') or None)
    args = request['args']
    if args[0] == '-c':
      sys.argv = ['-c']
      sys.modules['__main__'] = module = types.ModuleType('__main__')
      exec(compile(args[1], '<string>', 'exec'), module.__dict__)  # pylint: disable=exec-used
    else:
      main = sys.modules['paxlike.main']
      sys.argv = [main.__file__, *args[2:]]
      main.run_cli()
    code = 0
  except SystemExit as exit_:
    code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    if isinstance(exit_.code, str):
      print(exit_.code, file=sys.stderr)
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve() -> None:
  """The server's loop: a child per request line on stdin, its pid and exit status on stdout."""
  replies = os.dup(1)
  os.dup2(2, 1)  # Nothing of the server's own goes down the reply channel.
  for name in PRELOAD:
    importlib.import_module(name)
  from paxlike import registry
  registry.import_all()
  with os.fdopen(replies, 'w') as reply:
    for line in sys.stdin:
      request = json.loads(line)
      pid = os.fork()
      if pid == 0:
        _child(request, replies)
      reply.write(json.dumps({'pid': pid}) + '\n')
      reply.flush()
      _, status = os.waitpid(pid, 0)
      reply.write(json.dumps({'status': os.waitstatus_to_exitcode(status)}) + '\n')
      reply.flush()


if __name__ == '__main__':
  serve()
