"""A warm launcher for Flower's `flwr-clientapp`: a server that has imported what a ClientApp
process imports (Flower, JAX, paxlike's ClientApp) and forks one child per message, in place of
the fresh process a SuperNode's `flower-superexec` starts for every message, which imports it
all again (docs/flower.md, "The warm ClientApp launcher", has what that costs).

  python -m paxlike.deploy.flower.warm_clientapp --socket PATH --bin-dir DIR

writes DIR/flwr-clientapp (a stdlib-only shim), imports, then listens on the Unix socket PATH.
With DIR first on a SuperNode's PATH, its superexec runs the shim, which hands its argv,
environment, cwd and stdin/stdout/stderr to the server (SCM_RIGHTS) and exits once the server
has forked the child; the child becomes `flwr-clientapp ARGS` (Flower's own entry point parses
them, `--parent-pid` included, so a child outlives no killed superexec). When the server cannot
be reached, or refuses a caller whose import-time environment is not its own, the shim
execs the real `flwr-clientapp`. The server writes one line per fork and per exit to stdout.

The server forks while it has one thread and no JAX backend, so each child starts its own.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

from paxlike.deploy import forked_child

# What a ClientApp process imports: Flower's entry point and its HTTP client, paxlike's
# ClientApps, JAX and what loading a program imports, the data pipeline's TFDS and scipy.
PRELOAD = ('flwr.supernode.cli.flwr_clientapp', 'httpcore', 'h11', 'toml',
           'google.protobuf.json_format', 'paxlike.deploy.flower.client_app',
           'paxlike.deploy.flower.secure_client', 'jax', 'jax.export', 'jaxlib.mlir.dialects.mhlo',
           'paxlike.config.config_io', 'tensorflow_datasets', 'scipy.linalg', 'scipy.stats')
# Variables read when those modules are imported: a caller whose values differ is refused.
IMPORT_TIME_ENV = ('JAX_', 'XLA_', 'PYTHON', 'LD_', 'TF_', 'FLWR_TELEMETRY_', 'FLWR_SUPERGRID_')
MAX_SOCKET_PATH = 100  # sun_path holds 108 bytes.

SHIM = '''#!{python} -IS
"""flwr-clientapp, forked by paxlike's warm ClientApp server (paxlike.deploy.flower.
warm_clientapp); the real one when the server cannot be reached or refuses."""
import json, os, socket, sys
SOCKET, REAL = {socket!r}, {real!r}


def forked():
  try:
    fds = [fd if _is_open(fd) else os.open(os.devnull, os.O_RDWR) for fd in (0, 1, 2)]
    with socket.socket(socket.AF_UNIX) as s:
      s.settimeout(60)
      s.connect(SOCKET)
      socket.send_fds(s, [b'R'], fds)
      s.sendall(json.dumps({{'argv': sys.argv, 'env': dict(os.environ),
                             'cwd': os.getcwd()}}).encode())
      s.shutdown(socket.SHUT_WR)
      reply = json.loads(b''.join(iter(lambda: s.recv(1 << 16), b'')))
  except (OSError, ValueError) as error:
    reply = {{'error': repr(error)}}
  if 'pid' not in reply:
    print(f'flwr-clientapp: not forked by {{SOCKET}} ({{reply.get("error")}}); running {{REAL}}',
          file=sys.stderr, flush=True)
  return 'pid' in reply


def _is_open(fd):
  try:
    return os.fstat(fd) is not None
  except OSError:
    return False


if not forked():
  os.execv(REAL, [REAL, *sys.argv[1:]])
'''


def write_shim(bin_dir: Path, socket_path: Path, real: Path) -> Path:
  """DIR/flwr-clientapp: the shim for the server at `socket_path`, falling back to `real`."""
  bin_dir.mkdir(parents=True, exist_ok=True)
  shim = bin_dir / 'flwr-clientapp'
  shim.write_text(SHIM.format(python=sys.executable, socket=str(socket_path.absolute()),
                              real=str(real)))
  shim.chmod(0o755)
  return shim


def socket_path(out: Path) -> Path:
  """`out`/warm_clientapp.sock, or a socket in a new temporary directory where that path is
  too long for a Unix socket."""
  path = out.absolute() / 'warm_clientapp.sock'
  if len(str(path)) <= MAX_SOCKET_PATH:
    return path
  return Path(tempfile.mkdtemp(prefix='paxlike-warm-')) / 'sock'


def preload() -> None:
  """Imports PRELOAD and every registered experiment (what building a node's task imports)."""
  for name in PRELOAD:
    importlib.import_module(name)
  from paxlike import registry
  registry.import_all()


def refusal(env: dict[str, str], own: dict[str, str]) -> str | None:
  """Why a caller in `env` cannot be forked from a server started in `own` (None: it can)."""
  keys = {k for k in env.keys() | own.keys() if k.startswith(IMPORT_TIME_ENV)}
  changed = sorted(k for k in keys if env.get(k) != own.get(k))
  return f'import-time variables differ: {", ".join(changed)}' if changed else None


def _log(line: str) -> None:
  print(line, flush=True)


def become_clientapp(request: dict, fds: list[int]) -> NoReturn:
  """In a forked child: `flwr-clientapp ARGS` with the caller's fds, env and cwd; exits with
  its code and never returns."""
  def clientapp() -> None:
    for target, fd in enumerate(fds):
      os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
      os.close(fd)
    forked_child.take_environment(request['env'])
    os.chdir(request['cwd'])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    sys.argv = ['flwr-clientapp', *request['argv'][1:]]
    from paxlike.deploy.flower import flower_patches
    flower_patches.apply('client_app')  # Its SuperNode lists the message before its arrays.
    sys.modules['flwr.supernode.cli.flwr_clientapp'].flwr_clientapp()
  forked_child.exit_as_main(clientapp)


def _read_request(conn: socket.socket) -> tuple[dict, list[int]]:
  """A shim's request: its fds (sent with the first byte), then its JSON until EOF."""
  conn.settimeout(10)
  _, fds, _, _ = socket.recv_fds(conn, 1, 3)
  body = b''.join(iter(lambda: conn.recv(1 << 16), b''))
  return json.loads(body), fds


def handle(server: socket.socket, conn: socket.socket, own_env: dict[str, str]) -> None:
  """Forks a ClientApp for the request on `conn` and answers {"pid": PID} or {"error": WHY}
  (`own_env`: the server's environment before its imports, which may set variables)."""
  fds: list[int] = []
  try:
    request, fds = _read_request(conn)
    if len(fds) != 3:
      raise ValueError(f'{len(fds)} file descriptors, not 3')
    if (why := refusal(request['env'], own_env)) is not None:
      _log(f'refused: {why}')
      conn.sendall(json.dumps({'error': why}).encode())
      return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = forked_child.fork()
    if pid == 0:
      server.close()
      conn.close()
      become_clientapp(request, fds)
    _log(f'forked {pid}')
    conn.sendall(json.dumps({'pid': pid}).encode())
  except Exception as error:  # pylint: disable=broad-except  A bad request ends only itself.
    _log(f'request failed: {error!r}')
  finally:
    for fd in fds:
      os.close(fd)


def reap() -> None:
  """Waits for the children that have exited, logging their exit codes."""
  while True:
    try:
      pid, status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
      return
    if pid == 0:
      return
    _log(f'exited {pid} {os.waitstatus_to_exitcode(status)}')


def serve(socket_path: Path) -> None:
  """Preloads, then forks a ClientApp per connection on `socket_path` until SIGTERM/SIGINT."""
  own_env = dict(os.environ)
  preload()
  signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
  socket_path.unlink(missing_ok=True)
  with socket.socket(socket.AF_UNIX) as server:
    server.bind(str(socket_path))
    try:
      server.listen(64)
      server.settimeout(0.5)  # Reap exited children at least this often.
      _log(f'listening on {socket_path}')
      while True:
        try:
          conn, _ = server.accept()
        except TimeoutError:
          conn = None
        if conn is not None:
          with conn:
            handle(server, conn, own_env)
        reap()
    finally:
      socket_path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
  from paxlike.deploy.flower import processes
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--socket', type=Path, required=True, help='The Unix socket to listen on.')
  parser.add_argument('--bin-dir', type=Path, required=True,
                      help='Where to write the flwr-clientapp shim (put it first on PATH).')
  args = parser.parse_args(argv)
  if len(str(args.socket.absolute())) > MAX_SOCKET_PATH:
    parser.error(f'--socket: a Unix socket path has at most {MAX_SOCKET_PATH} characters')
  write_shim(args.bin_dir, args.socket, processes.BIN / 'flwr-clientapp')
  serve(args.socket.absolute())


if __name__ == '__main__':
  main()
