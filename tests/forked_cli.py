"""A fork server for the suite's `python -m paxlike.main ARGS` (and the few other command lines
of FORKABLE) and `python -c SCRIPT` runs.

Each test worker keeps one server process that has imported the command line and what a run
imports, without starting a jax backend, so that XLA_FLAGS (the device count) stay each run's own.
The server forks one child per run. The child is still a process of its own: its exit code,
signals, os._exit and file descriptors are as they would be. It only skips the imports that every
run would otherwise pay again, and the interpreter's teardown: the child ends with os._exit,
as paxlike's own error exits do, so atexit handlers do not run (the trainer closes its
checkpoints and summaries itself before it returns).

Modules that only some runs import (ON_DEMAND: matplotlib's pyplot, dp_accounting) are left out
of PRELOAD, which every server pays for when it starts: a child reports each of them as it
begins to import it (a finder first on sys.meta_path, writing to a pipe the server reads), and
the server imports it then, before it forks another run, so that its later runs have it.

A run whose environment differs from the server's in a variable read at import time (say
PYTHONPATH, or JAX_* config) cannot be served. `ForkServer.run` then returns None, and the caller
starts a plain subprocess.

`ForkServer.start` is the server's `subprocess.Popen`: a handle with the child's pid, which a
test may signal or SIGKILL (with `new_session`, the child leads a session and process group of
its own, as with Popen's start_new_session, for a test that kills its whole group); runs may
overlap. A child of the server that starts runs of its own (scripts/reproduce.py's training
runs) can fork a server from itself first (`ForkServer.here`, whose `popen` stands in for
subprocess.Popen), while it still has one thread and no jax backend.

Protocol, one JSON line each way on the server's stdin/stdout: a request {args, env, cwd, stdout,
stderr, new_session} (args as after `python`; stdout and stderr are file paths), answered at
once with {"started": pid}; when a child exits, {"pid": pid, "status": exit code}. The server
sleeps until a request comes, a child reports an ON_DEMAND import or a child exits, waiting on
each child's pidfd (Linux 5.3+; the suite reads /proc elsewhere too).
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import IO, NoReturn

from paxlike.deploy import forked_child

REPO = Path(__file__).resolve().parents[1]
# What a training, eval or decode run imports.
PRELOAD = ('paxlike.main', 'paxlike.trainer.loop', 'paxlike.trainer.build', 'paxlike.trainer.restore',
           'paxlike.cli.decode_text', 'paxlike.data.prepare', 'tensorflow_datasets')
# What only some runs import, each about as dear as the rest of a run's start-up: matplotlib's
# pyplot (~0.3 s; the reproductions' pages, the plotting scripts) and dp_accounting (~0.9 s, with
# scipy; DP runs). A server imports one once a run of its own has (see `serve`): most servers
# never serve such a run. Neither starts a thread, a jax backend or reads a variable outside
# import_key; pyplot leaves the backend to be chosen when a child first draws (Agg without a
# display), in the child's own environment.
ON_DEMAND = ('matplotlib.pyplot', 'dp_accounting')
# The other command lines the server runs, as `python -m` would, from what it preloaded (not
# paxlike.interop.hf, whose --job_log_dir would be defined a second time beside paxlike.main's).
# The local Flower launcher and the warm ClientApp server start processes of their own, as a
# fresh one would (from threads too: the fork is theirs, after the server's).
FORKABLE = ('paxlike.export', 'paxlike.export.run', 'paxlike.tokenizers',
            'paxlike.deploy.flower.local', 'paxlike.deploy.flower.warm_clientapp')
# Variables a run reads when it runs, not when its modules are imported: these may differ
# between the server and a run it serves (the child hands JAX_PLATFORMS to jax's config, which
# read it at import).
RUNTIME_ENV = ('XLA_FLAGS', 'PAXLIKE_', 'PYTEST_', 'JAX_PLATFORMS', 'PJRT_NPROC')


def import_key(env: dict[str, str]) -> frozenset[tuple[str, str]]:
  """What of `env` a run's imports may read: the variables not in RUNTIME_ENV."""
  return frozenset((k, v) for k, v in env.items() if not k.startswith(RUNTIME_ENV))


def servable(server_env: dict[str, str], env: dict[str, str]) -> bool:
  """Whether a run in `env` can be forked from a server started in `server_env`."""
  return import_key(server_env) == import_key(env)


def runnable(args: list[str]) -> bool:
  """Whether `python ARGS` is a run the server makes: `-m paxlike.main ...`, `-m MODULE ...` for
  a MODULE of FORKABLE, or `-c SCRIPT`."""
  return ((len(args) >= 2 and args[0] == '-m' and args[1] in ('paxlike.main', *FORKABLE))
          or (len(args) == 2 and args[0] == '-c'))


class ForkedProcess:
  """A forked `python ARGS` run, as much of `subprocess.Popen` as the suite uses: pid, poll,
  wait, send_signal, kill, terminate, returncode."""

  def __init__(self, server: ForkServer, args: list[str], pid: int):
    self.server, self.args, self.pid, self.returncode = server, args, pid, None

  def poll(self) -> int | None:
    if self.returncode is None:
      self.returncode = self.server.exit_code(self.pid, block=False)
    return self.returncode

  def wait(self, timeout: float | None = None) -> int:
    if self.returncode is None:
      self.returncode = self.server.exit_code(self.pid, block=True, timeout=timeout)
    return self.returncode

  def send_signal(self, sig: int) -> None:
    if self.poll() is None:
      try:  # It may have exited (and been reaped by the server) since its exit was last read.
        os.kill(self.pid, sig)
      except ProcessLookupError:  # As subprocess.Popen.send_signal: a run already gone.
        pass

  def kill(self) -> None:
    self.send_signal(signal.SIGKILL)

  def terminate(self) -> None:
    self.send_signal(signal.SIGTERM)


class ForkServer:
  """One server process; `run(args, ...)` is `subprocess.run([python, *args], ...)` and
  `start(args, ...)` is `subprocess.Popen`. Runs may overlap: the server forks each request at
  once and reports each exit as it happens. Safe to use from several threads."""

  def __init__(self, env: dict[str, str]):
    """A server in a new process started in `env` (see `here` for one forked from this one)."""
    self.env = dict(env)
    self._lock = threading.RLock()
    self._exits: dict[int, int] = {}  # pid -> exit code, reported but not yet asked for.
    self._buffer = b''  # Reply bytes read but not yet a whole line.
    self.proc = subprocess.Popen([sys.executable, '-m', 'tests.forked_cli'], cwd=REPO, env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    self._requests, self._replies = self.proc.stdin, self.proc.stdout.fileno()

  @classmethod
  def here(cls) -> ForkServer:
    """A server forked from this process now, serving runs in its environment: for a process
    with one thread and no jax backend that will start runs after it has lost one of these
    (threads, say). What the server preloads is imported here first when this process was not
    itself forked from a server (a fresh interpreter, when its run could not be forked)."""
    from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
    preload()
    if threading.active_count() != 1 or xla_bridge.backends_are_initialized():
      raise RuntimeError('ForkServer.here: fork before any thread or jax backend starts')
    requests, replies = os.pipe(), os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      try:
        os.dup2(requests[0], 0)
        os.dup2(replies[1], 1)
        for fd in (*requests, *replies):
          os.close(fd)
        serve(preloaded=True)
      finally:
        os._exit(0)
    os.close(requests[0])
    os.close(replies[1])
    self = cls.__new__(cls)
    self.env = dict(os.environ)
    self._lock = threading.RLock()
    self._exits = {}
    self._buffer = b''
    self.proc = None
    self._pid = pid
    self._requests, self._replies = os.fdopen(requests[1], 'wb'), replies[0]
    return self

  def alive(self) -> bool:
    if self.proc is not None:
      return self.proc.poll() is None
    return os.waitpid(self._pid, os.WNOHANG)[0] == 0

  def can_run(self, args: list[str], env: dict[str, str]) -> bool:
    return self.alive() and runnable(args) and servable(self.env, env)

  def start(self, args: list[str], env: dict[str, str], stdout: str | Path = os.devnull,
            stderr: str | Path = os.devnull, cwd: str | Path = REPO, new_session: bool = False
            ) -> ForkedProcess | None:
    """`python ARGS` started in the background in `cwd`, writing to the files `stdout` and
    `stderr` (the same path: one file, as with stderr=subprocess.STDOUT), in a session of its
    own when `new_session` (Popen's start_new_session); None if this server cannot make it (see
    `runnable` and `servable`)."""
    if not self.can_run(args, env):
      return None
    with self._lock:
      self._requests.write(json.dumps({'args': args, 'env': env, 'cwd': str(cwd),
                                       'stdout': str(stdout), 'stderr': str(stderr),
                                       'new_session': new_session}).encode() + b'\n')
      self._requests.flush()
      while 'started' not in (reply := self._reply(timeout=60)):
        self._exits[reply['pid']] = reply['status']
    return ForkedProcess(self, [sys.executable, *args], reply['started'])

  def popen(self, argv: list[str], *, cwd: str | Path, env: dict[str, str], stdout: IO,
            stderr: IO | int) -> ForkedProcess | subprocess.Popen:
    """`subprocess.Popen(argv, ...)` for `argv` = [sys.executable, *ARGS]: forked by this server
    when it can be, else started afresh. `stdout` is a file opened by path, `stderr` one or
    subprocess.STDOUT."""
    err = stdout if stderr == subprocess.STDOUT else stderr
    if argv[0] == sys.executable and (
        proc := self.start(argv[1:], env, stdout.name, err.name, cwd)):
      return proc
    return subprocess.Popen(argv, cwd=cwd, env=env, stdout=stdout, stderr=stderr)

  def exit_code(self, pid: int, block: bool, timeout: float | None = None) -> int | None:
    """The exit code of the server's child `pid`: waiting for it up to `timeout` (None: for
    ever) when `block`, else None if it has not been reported yet."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with self._lock:
      while pid not in self._exits:
        left = 0 if not block else None if deadline is None else max(0, deadline - time.monotonic())
        if not self._line_within(left):
          if block:
            raise subprocess.TimeoutExpired(f'forked pid {pid}', timeout)
          return None
        reply = self._reply(timeout=60)
        self._exits[reply['pid']] = reply['status']
      return self._exits.pop(pid)

  def run(self, args: list[str], env: dict[str, str], timeout: float
          ) -> subprocess.CompletedProcess | None:
    """The finished `python ARGS` run, as subprocess.run(capture_output=True, text=True)
    returns it (raising TimeoutExpired after killing it past `timeout`); None if this server
    cannot make it (see `runnable` and `servable`)."""
    with tempfile.TemporaryDirectory(prefix='forked_cli') as tmp:
      out, err = Path(tmp) / 'stdout', Path(tmp) / 'stderr'
      proc = self.start(args, env, out, err)
      if proc is None:
        return None
      try:
        proc.wait(timeout)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=60)
        raise subprocess.TimeoutExpired(proc.args, timeout, out.read_text(),
                                        err.read_text()) from None
      return subprocess.CompletedProcess(proc.args, proc.returncode, out.read_text(),
                                         err.read_text())

  def _line_within(self, timeout: float | None) -> bool:
    """Whether a whole reply line is here, or comes within `timeout` (None: waits for one)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while b'\n' not in self._buffer:
      left = None if deadline is None else max(0, deadline - time.monotonic())
      if not select.select([self._replies], [], [], left)[0]:
        return False
      data = os.read(self._replies, 1 << 16)
      if not data:
        raise RuntimeError('the fork server exited')
      self._buffer += data
    return True

  def _reply(self, timeout: float) -> dict:
    if not self._line_within(timeout):
      raise subprocess.TimeoutExpired('forked paxlike.main', timeout)
    line, self._buffer = self._buffer.split(b'\n', 1)
    return json.loads(line)

  def close(self) -> None:
    self._requests.close()
    if self.proc is not None:
      self.proc.wait(timeout=30)
    else:
      os.close(self._replies)
      os.waitpid(self._pid, 0)


class _ReportOnDemand:
  """A finder first on a child's sys.meta_path: writes the name of each ON_DEMAND module the
  child begins to import to the server's pipe `fd` (one short write: whole, beside other
  children's), and finds nothing itself."""

  def __init__(self, fd: int):
    self.fd = fd

  def find_spec(self, name: str, path: object = None, target: object = None) -> None:
    if name in ON_DEMAND:
      try:
        os.write(self.fd, f'{name}\n'.encode())
      except OSError:  # The server has gone: nothing to tell it.
        pass


def _become(args: list[str], env: dict[str, str], cwd: str, stdout: int, stderr: int,
            on_demand: int, new_session: bool) -> NoReturn:
  """In a forked child: become `python ARGS` (`-m MODULE ...` or `-c SCRIPT`) in `env` and
  `cwd`, writing to the file descriptors `stdout` and `stderr`, leading a session of its own
  when `new_session`, and exit with its code; the ON_DEMAND modules it imports are reported to
  the server on the pipe `on_demand`."""
  def program() -> None:
    if new_session:
      os.setsid()
    sys.meta_path.insert(0, _ReportOnDemand(on_demand))
    os.chdir(cwd)
    forked_child.take_environment(env)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own defaults.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.modules['jax'].config.update('jax_platforms', os.environ.get('JAX_PLATFORMS') or None)
    if args[0] == '-c':
      sys.argv = ['-c']
      sys.modules['__main__'] = module = types.ModuleType('__main__')
      exec(compile(args[1], '<string>', 'exec'), module.__dict__)  # pylint: disable=exec-used
    elif args[1] == 'paxlike.main':
      main = sys.modules['paxlike.main']
      sys.argv = [main.__file__, *args[2:]]
      main.run_cli()
    else:
      sys.argv = [args[1], *args[2:]]
      runpy.run_module(args[1], run_name='__main__', alter_sys=True)  # argv[0]: the module's file.
  forked_child.exit_as_main(program)


def _open(path: str) -> int:
  return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)


def preload() -> None:
  """Imports PRELOAD and every registered experiment (a no-op where they are imported)."""
  for name in PRELOAD:
    importlib.import_module(name)
  from paxlike import registry  # pylint: disable=import-outside-toplevel
  registry.import_all()


def _import_on_demand(names: bytes) -> None:
  """Imports the ON_DEMAND modules among the lines `names` (children's reports) that this
  process has not imported yet; one that fails to import is left to the children."""
  for name in names.decode().split():
    if name in ON_DEMAND and name not in sys.modules:
      try:
        importlib.import_module(name)
      except Exception:  # pylint: disable=broad-except  The children meet it themselves.
        pass


def serve(preloaded: bool = False) -> None:
  """The server's loop: a child per request line on stdin, answered at once with {"started":
  pid}; each child's exit, as it happens, with {"pid": pid, "status": exit code}. First the
  imports of PRELOAD and every experiment, unless this process has them (`ForkServer.here`).
  An ON_DEMAND module a child reports importing is imported before anything else is done (so
  before the child's exit is answered, which comes after its report)."""
  replies = os.dup(1)
  os.dup2(2, 1)  # Nothing of the server's own goes down the reply channel.
  if not preloaded:
    preload()
  children: dict[int, int] = {}  # A pidfd (readable once its child has exited) -> the pid.
  pending = b''
  reported, report = os.pipe()  # Children write the ON_DEMAND modules they import to `report`.
  os.set_blocking(report, False)  # A child never waits on it (a full pipe: the report is lost).
  with os.fdopen(replies, 'w') as reply:
    def send(message: dict) -> None:
      reply.write(json.dumps(message) + '\n')
      reply.flush()

    while True:
      # Blocks until a request comes, a child reports or a child exits: no polling while runs
      # go on.
      ready = select.select([0, reported, *children], [], [])[0]
      if reported in ready:
        _import_on_demand(os.read(reported, 1 << 16))
      if 0 in ready:
        data = os.read(0, 1 << 16)
        if not data:
          return
        pending += data
        while b'\n' in pending:
          line, pending = pending.split(b'\n', 1)
          request = json.loads(line)
          sys.stdout.flush()
          sys.stderr.flush()
          pid = forked_child.fork()
          if pid == 0:
            for fd in (reply.fileno(), reported, *children):
              os.close(fd)
            out = _open(request['stdout'])
            err = out if request['stderr'] == request['stdout'] else _open(request['stderr'])
            _become(request['args'], request['env'], request['cwd'], out, err, report,
                    request.get('new_session', False))
          children[os.pidfd_open(pid)] = pid
          send({'started': pid})
      for fd in ready:
        if fd in children:
          pid = children.pop(fd)
          os.close(fd)
          _, status = os.waitpid(pid, 0)
          send({'pid': pid, 'status': os.waitstatus_to_exitcode(status)})


if __name__ == '__main__':
  serve()
