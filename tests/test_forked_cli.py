"""tests/forked_cli.py: a CLI run forked from the worker's server is the run a fresh process
makes (exit code, stdout, stderr), with the device count of its own XLA_FLAGS; a run whose
import-time environment differs is not forked; importing what the server preloads starts no
jax backend, which is what lets each child choose its devices; a module only some runs import
is the server's once one has; a run may lead a session of its own."""

import os
import subprocess
import sys

from tests import forked_cli, helpers
from tests.helpers import REPO, TINY, cli_env, run_python, run_script


def fresh(*args: str, module: str = 'paxlike.main', devices: int = 1
          ) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-m', module, *args], cwd=REPO, text=True,
                        capture_output=True, timeout=300, env=cli_env(devices))


def test_a_forked_run_is_the_run_a_fresh_process_makes(tmp_path):
  server = forked_cli.ForkServer(cli_env(1))
  try:
    for args in (['--exp=lm.StdlibTiny', '--mode=print_config'], ['--exp=no.Such'],
                 ['--exp=lm.StdlibTiny', '--nosuchflag']):
      forked = server.run(['-m', 'paxlike.main', *args], cli_env(1), timeout=120)
      alone = fresh(*args)
      assert (forked.returncode, forked.stdout, forked.stderr) == (
          alone.returncode, alone.stdout, alone.stderr), args
    assert forked.returncode == 2
    # The other command lines it forks (a package's __main__; absl's and argparse's program
    # names; the registry's experiments).
    for module, args, needle in (('paxlike.tokenizers', ['train'], '--files'),
                                 ('paxlike.export.run', [f'--dir={tmp_path}'], 'plan.json'),
                                 ('paxlike.export', ['--exp=federated.NoSuch', f'--out={tmp_path}'],
                                  'did you mean')):  # The registry, imported again.
      forked = server.run(['-m', module, *args], cli_env(1), timeout=120)
      alone = fresh(*args, module=module)
      assert (forked.returncode, forked.stdout, forked.stderr) == (
          alone.returncode, alone.stdout, alone.stderr), module
      assert forked.returncode in (1, 2) and needle in forked.stderr
    # The mesh of `cpu8` needs 8 devices: the child has them when its XLA_FLAGS say so.
    args = [*TINY, '--fdl_fiddler=cpu8', '--fdl_set=train.num_steps=1', '--fdl_set=train.eval_every=1']
    one = server.run(['-m', 'paxlike.main', *args, f'--job_log_dir={tmp_path / "one"}'], cli_env(1),
                     timeout=120)
    assert one.returncode == 2 and 'device' in one.stderr
    eight = server.run(['-m', 'paxlike.main', *args, f'--job_log_dir={tmp_path / "eight"}'],
                       cli_env(8), timeout=300)
    assert eight.returncode == 0, eight.stderr[-2000:]
    assert (tmp_path / 'eight' / 'metrics.jsonl').exists()
  finally:
    server.close()


def test_only_the_cli_and_scripts_with_runtime_variables_changed_are_forked():
  env = {'PATH': '/bin', 'XLA_FLAGS': '', 'PAXLIKE_DATA_DIR': '/a'}
  assert forked_cli.servable(env, {**env, 'XLA_FLAGS': '--x=1', 'PAXLIKE_DATA_DIR': '/b',
                                   'PYTEST_CURRENT_TEST': 't', 'JAX_PLATFORMS': 'cpu'})
  assert not forked_cli.servable(env, {**env, 'PYTHONPATH': '/elsewhere'})
  assert not forked_cli.servable(env, {**env, 'JAX_ENABLE_X64': '1'})
  assert not forked_cli.servable(env, {k: v for k, v in env.items() if k != 'PATH'})
  assert forked_cli.runnable(['-m', 'paxlike.main', '--list']) and forked_cli.runnable(['-c', 'x'])
  assert forked_cli.runnable(['-m', 'paxlike.export', '--exp=x'])
  assert forked_cli.runnable(['-m', 'paxlike.deploy.flower.local', '--out=x'])
  assert not forked_cli.runnable(['-m', 'paxlike.interop.hf']) and not forked_cli.runnable(['x.py'])


def test_a_variable_read_at_import_gets_a_server_of_its_own_and_leaves_the_others(monkeypatch):
  """A run in an environment of its own (XDG_CACHE_HOME, say) is forked from a server started
  in it; runs in the usual environment keep theirs, whichever asked first."""
  monkeypatch.setattr(helpers, '_SERVERS', {})
  usual = cli_env(1)
  own = cli_env(1, XDG_CACHE_HOME='/elsewhere')
  try:
    first = helpers._fork_server(own)  # pylint: disable=protected-access
    assert first.can_run(['-m', 'paxlike.main'], own)
    assert not first.can_run(['-m', 'paxlike.main'], usual)
    second = helpers._fork_server(cli_env(8))  # pylint: disable=protected-access
    assert second is not first and second.can_run(['-m', 'paxlike.main'], usual)
    assert helpers._fork_server(own) is first  # pylint: disable=protected-access
    assert forked_cli.import_key(own) != forked_cli.import_key(usual) == forked_cli.import_key(
        {**usual, 'XLA_FLAGS': '--x', 'PAXLIKE_DATA_DIR': '/b', 'PYTEST_CURRENT_TEST': 't'})
  finally:
    for server in helpers._SERVERS.values():  # pylint: disable=protected-access
      server.close()


def test_importing_what_the_server_preloads_starts_no_backend():
  out = run_script('import importlib\n'
                   f'for name in {forked_cli.PRELOAD!r}: importlib.import_module(name)\n'
                   'from paxlike import registry\n'
                   'registry.import_all()\n'
                   'from jax._src import xla_bridge\n'
                   'print(sorted(xla_bridge._backends))\n', devices=1)
  assert out.strip() == '[]'


def test_a_module_some_runs_import_is_the_servers_once_one_has():
  """A run that imports the ON_DEMAND modules (matplotlib's pyplot, dp_accounting) makes its
  server import them, before that run's exit is answered: the next run starts with them, and
  still with no jax backend, and pyplot picks Agg there is no display."""
  env = {k: v for k, v in cli_env(1).items() if k not in ('DISPLAY', 'WAYLAND_DISPLAY')}
  imported = run_python(['-c', f'import {", ".join(forked_cli.ON_DEMAND)}'], env, timeout=120)
  assert imported.returncode == 0, imported.stderr[-2000:]
  probe = run_python(['-c', 'import sys\n'
                      f'print(all(name in sys.modules for name in {forked_cli.ON_DEMAND!r}))\n'
                      'from jax._src import xla_bridge\n'
                      'print(xla_bridge.backends_are_initialized())\n'
                      'import matplotlib\n'
                      'print(matplotlib.get_backend().lower())\n'], env, timeout=120)
  assert probe.stdout.split() == ['True', 'False', 'agg'], probe.stderr[-2000:]


def test_a_forked_script_is_the_script_a_fresh_process_runs():
  server = forked_cli.ForkServer(cli_env(1))
  try:
    script = ('import sys, jax\n'
              'print(len(jax.devices()), jax.devices()[0].platform, __name__)\n'
              'print("to stderr", file=sys.stderr)\n'
              'raise SystemExit(3)\n')
    env = cli_env(4, JAX_PLATFORMS='cpu')
    forked = server.run(['-c', script], env, timeout=120)
    alone = subprocess.run([sys.executable, '-c', script], cwd=REPO, text=True,
                           capture_output=True, timeout=120, env=env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        alone.returncode, alone.stdout, alone.stderr) == (3, '4 cpu __main__\n', 'to stderr\n')
    failed = server.run(['-c', '1 / 0'], env, timeout=120)
    assert failed.returncode == 1 and failed.stderr.strip().endswith(
        'ZeroDivisionError: division by zero')
  finally:
    server.close()


def test_started_runs_overlap_and_report_their_own_exits_and_signals(tmp_path):
  server = forked_cli.ForkServer(cli_env(1))
  try:
    long = server.start(['-m', 'paxlike.main', *TINY, '--fdl_set=train.num_steps=100000',
                         f'--job_log_dir={tmp_path / "long"}'], cli_env(1))
    assert long.poll() is None
    # Another run starts and ends while the first goes on: each exit reaches its own handle.
    bad = server.start(['-m', 'paxlike.main', '--exp=no.Such'], cli_env(1),
                       stderr=tmp_path / 'bad.err')
    assert bad.wait(timeout=120) == 2 and 'no.Such' in (tmp_path / 'bad.err').read_text()
    assert long.poll() is None
    # One in a session and process group of its own (Popen's start_new_session), stdout and
    # stderr one file; the others stay in the server's.
    leader = server.start(['-c', 'import os, sys\nprint(os.getsid(0) == os.getpgid(0) == '
                           'os.getpid())\nprint("err", file=sys.stderr)'], cli_env(1),
                          tmp_path / 'leader.log', tmp_path / 'leader.log', new_session=True)
    assert leader.wait(timeout=60) == 0
    assert (tmp_path / 'leader.log').read_text() == 'True\nerr\n'
    assert os.getpgid(long.pid) == os.getpgid(server.proc.pid) != long.pid
    long.kill()
    assert long.wait(timeout=60) == -9 and long.returncode == -9
    # A run gone before its exit is read (reaped, its report still on the way) takes a signal
    # as subprocess.Popen's does: nothing happens.
    gone = subprocess.Popen(['true'])
    gone.wait()
    assert forked_cli.ForkedProcess(server, ['-c', 'pass'], gone.pid).poll() is None
    forked_cli.ForkedProcess(server, ['-c', 'pass'], gone.pid).kill()
  finally:
    server.close()


def test_a_server_forked_from_a_forked_script_serves_it_after_it_starts_threads(tmp_path):
  """What tests/test_reproduce.py does with scripts/reproduce.py, whose runs start from threads."""
  out = run_script(f'''
import os, subprocess, sys, threading
from tests.forked_cli import ForkedProcess, ForkServer
here = ForkServer.here()
procs = []
def start(i):
  with open({str(tmp_path)!r} + f'/{{i}}.log', 'w') as log:
    procs.append(here.popen([sys.executable, '-c', f'import sys; print({{i}}, file=sys.stderr)'],
                            cwd='/', env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT))
threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
for t in threads: t.start()
for t in threads: t.join()
print(sorted(p.wait(timeout=60) for p in procs), all(isinstance(p, ForkedProcess) for p in procs))
''', devices=1)
  assert out.strip() == '[0, 0] True'
  assert [(tmp_path / f'{i}.log').read_text() for i in range(2)] == ['0\n', '1\n']
