"""The local launcher under an operator's faults (issue 72): the launcher killed (kill -9 of its
process group, SIGINT, SIGTERM) takes its Flower processes down with it, and the same command on
the same --out resumes from the ServerApp's last checkpoint with the uninterrupted run's rows."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.deploy import flower_procs as fp
from tests.helpers import REPO, cli_env

OWNER = """
import os, sys, time
from pathlib import Path
from paxlike.deploy.flower import processes
token = sys.argv[2]
group = processes.Group(dict(os.environ), Path(sys.argv[1]))
sleeper = f'import time; time.sleep(600)  # {token}'
# A leader whose child runs in a session of its own, as a SuperLink's flower-superexec does.
group.start('a', [sys.executable, '-c', 'import subprocess, sys, time; subprocess.Popen('
                  f'[sys.executable, "-c", {sleeper!r}], start_new_session=True); {sleeper}'])
group.start('b', [sys.executable, '-c', sleeper])
print('started', flush=True)
time.sleep(600)
"""


def _with_token(token: str, but: int | None = None) -> list[int]:
  """The processes whose command line holds `token`, but process `but`."""
  return [pid for pid, (_, cmd, _) in fp.processes().items() if token in cmd and pid != but]


def test_a_group_owner_killed_with_sigkill_takes_its_groups_and_their_sessions_down(tmp_path):
  """The owner of a processes.Group (the launcher) dies by SIGKILL to its process group: its
  groups, and a process one of them started in a session of its own, are gone within seconds
  (before the watchdog: all three ran on)."""
  token = uuid.uuid4().hex
  owner = subprocess.Popen([sys.executable, '-c', OWNER, str(tmp_path / 'logs'), token],
                           cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, text=True,
                           start_new_session=True)
  try:
    assert owner.stdout.readline().strip() == 'started'
    # The owner's own command line holds the token too: it is not one of the three.
    fp.wait_until(lambda: len(_with_token(token, owner.pid)) == 3, 30, 'the three sleepers')
    os.killpg(owner.pid, signal.SIGKILL)
    owner.wait()
    began = time.monotonic()
    fp.wait_until(lambda: not _with_token(token), 10, 'the sleepers to be gone')
    print(f'gone {time.monotonic() - began:.2f} s after the kill')
  finally:
    for pid in _with_token(token):
      os.kill(pid, signal.SIGKILL)


ROUNDS = 3


def _launch(export: Path, out: Path, log: Path):
  return fp.start_group([sys.executable, '-m', 'paxlike.deploy.flower.local', *fp.CLI_TINY,
                         f'--export_dir={export}', f'--out={out}', f'--rounds={ROUNDS}',
                         '--nodes=2', '--round_timeout=90'], log)


def _gone_within(began_ticks: float, seconds: float) -> float:
  """Seconds until no Flower process started since `began_ticks` runs (AssertionError after
  `seconds`)."""
  began = time.monotonic()
  fp.wait_until(lambda: not fp.flower_processes_since(began_ticks), seconds,
                'the Flower processes to be gone')
  return time.monotonic() - began


@pytest.mark.slow  # Three launches of a 2-node federation, each a SuperLink and two nodes.
def test_killed_and_stopped_launchers_take_flower_down_and_the_same_command_resumes(
    tmp_path_factory, tmp_path):
  """kill -9 of the launcher's process group once round 1 is checkpointed: every Flower process
  it started is gone within seconds; the same command on the same --out resumes, and SIGTERM
  once round 2 is checkpointed stops it cleanly (exit 0, one line, round 2 saved, no process
  left); the same command again finishes round 3. The rows equal the executor's uninterrupted
  rounds (the simulation's cohorts, no slot dropped)."""
  from paxlike.config import config_io
  from paxlike.data import sources
  from tests.deploy.reference import assert_rows_equal, executor_rounds
  export, out = fp.digits_export(tmp_path_factory), tmp_path / 'run'
  checkpoint = out / 'server' / 'checkpoints'
  began = fp.now_ticks()
  first = _launch(export, out, tmp_path / 'first.log')
  try:
    fp.wait_until(lambda: (checkpoint / '1').is_dir(), 400, 'round 1\'s checkpoint', first)
    running = len(fp.flower_processes_since(began))
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    gone = _gone_within(began, 20)
    print(f'kill -9: {running} Flower processes, all gone {gone:.1f} s after')
    assert running >= 5  # The SuperLink, two nodes, flwr run, the warm server (and the apps).
  finally:
    fp.stop_group(first)
  began = fp.now_ticks()
  second = _launch(export, out, tmp_path / 'second.log')
  try:
    fp.wait_until(lambda: (checkpoint / '2').is_dir(), 400, 'round 2\'s checkpoint', second)
    stopped_at = time.monotonic()
    os.kill(second.pid, signal.SIGTERM)
    code = second.wait(timeout=120)
    print(f'SIGTERM: exit {code} after {time.monotonic() - stopped_at:.1f} s')
  finally:
    fp.stop_group(second)
  log = (tmp_path / 'second.log').read_text()
  assert code == 0, log[-3000:]
  assert 'resuming' in log and 'after round 1' in log
  last = log.strip().splitlines()[-1]
  assert last.startswith('paxlike.deploy.flower.local: stopped by SIGTERM after round '), last
  assert 'Traceback' not in log
  assert (checkpoint / '2').is_dir()
  _gone_within(began, 20)
  third = subprocess.run([sys.executable, '-m', 'paxlike.deploy.flower.local', *fp.CLI_TINY,
                          f'--export_dir={export}', f'--out={out}', f'--rounds={ROUNDS}',
                          '--nodes=2', '--round_timeout=90'], cwd=REPO, env=cli_env(),
                         capture_output=True, text=True, timeout=600)
  assert third.returncode == 0, third.stderr[-3000:]
  rows = fp.rows(out / 'server' / 'metrics.jsonl')
  cohorts = fp.rows(out / 'server' / 'cohorts.jsonl')
  assert [r['step'] for r in rows] == [c['step'] for c in cohorts] == [1, 2, 3]
  task = config_io.build(config_io.load_file(out / 'config.json'))
  for c in cohorts:  # Uninterrupted: the simulation's cohort, every slot run.
    assert c['cohort'] == sources.sample_cohort(task.train.seed, c['step'],
                                                task.data.client_sizes, 3, 'uniform').tolist()
    assert c['dropped_slots'] == []
  assert_rows_equal(rows, executor_rounds(task, export, cohorts))
  assert sorted(p.name for p in out.glob('logs.*')) == ['logs.1', 'logs.2']


def _listening_socket() -> socket.socket:
  """A listener on a free port, as another program that took the port in the gap."""
  taken = socket.socket()
  taken.bind(('127.0.0.1', 0))
  taken.listen()
  return taken


def test_a_port_taken_before_the_superlink_binds_moves_it_to_another_and_one_that_stays_taken_is_named(
    tmp_path):
  """Another process listens on the port chosen for the SuperLink: the SuperLink starts again on
  another port, which FLWR_HOME's connection names, and a node key enrolls through it (before:
  the launcher took the other listener for the SuperLink, and the enrollment failed with
  "['}']" 39 s later). With one attempt only, the failure is one line naming the port."""
  from paxlike.deploy.flower import federation, processes
  from paxlike.errors import RunFailure
  out = tmp_path / 'run'
  out.mkdir()
  began = fp.now_ticks()
  group = processes.Group(processes.flower_env(out / 'flwr_home'), out / 'logs')
  with _listening_socket() as taken:
    port = taken.getsockname()[1]
    try:
      fed = federation.Federation(group, out, port)
      fed.start_superlink(60)
      assert fed.port != port
      assert f'127.0.0.1:{fed.port}' in (out / 'flwr_home' / 'config.toml').read_text()
      fed.new_identity('node0')
      assert 'node0' in fed.node_ids
      other = federation.Federation(group, tmp_path / 'other', port)
      with pytest.raises(RunFailure) as failed:
        other.start_superlink(60, attempts=1)
    finally:
      group.stop()
  message = str(failed.value)
  assert f'port {port} (taken)' in message and '\n' not in message, message
  assert fp.flower_processes_since(began) == []


def _launcher(*args: str, blocked: str | None = None) -> subprocess.CompletedProcess:
  """The launcher with `args`; `blocked`: a package this launcher's Python cannot import (as
  when it is not installed: `import` raises ImportError)."""
  from tests.helpers import run_python
  if blocked is None:
    return run_python(['-m', 'paxlike.deploy.flower.local', *args], cli_env(), timeout=300)
  code = (f'import runpy, sys; sys.modules[{blocked!r}] = None; '
          f'sys.argv = ["local", *{list(args)!r}]; '
          'runpy.run_module("paxlike.deploy.flower.local", run_name="__main__", alter_sys=True)')
  return run_python(['-c', code], cli_env(), timeout=300)


def _one_line(ran: subprocess.CompletedProcess) -> str:
  assert ran.returncode == 2, ran.stderr[-3000:]
  lines = ran.stderr.strip().splitlines()
  assert 'Traceback' not in ran.stderr and lines[-1].startswith('paxlike.deploy.flower.local'), (
      ran.stderr[-3000:])
  return lines[-1]


def test_more_nodes_than_clients_is_refused_in_one_line_naming_the_option(tmp_path_factory,
                                                                          tmp_path):
  """Before: the launcher quietly started 5 nodes for the 5 clients."""
  export = fp.digits_export(tmp_path_factory)
  line = _one_line(_launcher(*fp.CLI_TINY, f'--export_dir={export}', '--rounds=1', '--nodes=6',
                             f'--out={tmp_path / "run"}'))
  assert '--nodes=6' in line and '5 clients' in line, line
  assert not (tmp_path / 'run').exists()


def test_secure_aggregation_over_nodes_that_would_hold_no_client_is_refused(tmp_path):
  """--secure_aggregation --nodes=3 for an experiment of 2 clients: before (with 2 nodes and 1
  client), the launcher ran SecAgg+ over one node (its sums, that node's values, in the clear to
  the server)."""
  flags = [*fp.CLI_TINY, '--fdl_set=data.num_clients=2', '--fdl_set=data.clients_per_round=2']
  from tests.helpers import run_python
  made = run_python(['-m', 'paxlike.export', *flags, f'--out={tmp_path / "export"}',
                     '--rounds=1'], cli_env(), timeout=300)
  assert made.returncode == 0, made.stderr[-2000:]
  line = _one_line(_launcher(*flags, f'--export_dir={tmp_path / "export"}', '--rounds=1',
                             '--nodes=3', '--secure_aggregation', f'--out={tmp_path / "run"}'))
  assert '--nodes=3' in line and '2 clients' in line and '--secure_aggregation' in line, line
  assert not (tmp_path / 'run').exists()


def test_secure_aggregation_over_two_nodes_is_refused_in_one_line_naming_what_to_pass(
    tmp_path_factory, tmp_path):
  """Pairwise masks over 2 nodes hide nothing between them: each learns the other's
  contribution as the sum (the next round's model) less its own. Before: exit 0, SecAgg+ ran."""
  export = fp.digits_export(tmp_path_factory)
  for nodes in (1, 2):
    line = _one_line(_launcher(*fp.CLI_TINY, f'--export_dir={export}', '--rounds=1',
                               f'--nodes={nodes}', '--secure_aggregation',
                               f'--out={tmp_path / "run"}'))
    assert f'--secure_aggregation with --nodes={nodes}' in line, line
    assert line.endswith('pass --nodes=3 or more'), line
  assert not (tmp_path / 'run').exists()


def test_flwr_not_importable_is_refused_in_one_line_naming_the_package(tmp_path_factory,
                                                                       tmp_path):
  """Before: the launcher went on with Flower's processes."""
  export = fp.digits_export(tmp_path_factory)
  line = _one_line(_launcher(*fp.CLI_TINY, f'--export_dir={export}', '--rounds=1',
                             f'--out={tmp_path / "run"}', blocked='flwr'))
  assert 'flwr' in line and 'pip install' in line, line
  assert not (tmp_path / 'run').exists()


FULL_DISK = r'''
set -u
mount -t tmpfs -o size=64m tmpfs "$DISK"
"$PY" -m paxlike.deploy.flower.local "$@" --out="$DISK/run" >"$RESULT/first.out" 2>"$RESULT/first.err" &
launcher=$!
while [ ! -d "$DISK/run/server/checkpoints/1" ] && kill -0 $launcher 2>/dev/null; do sleep 0.2; done
dd if=/dev/zero of="$DISK/filler" bs=1M 2>/dev/null
df -k "$DISK" | tail -1 >"$RESULT/df"
wait $launcher; echo $? >"$RESULT/first.rc"
ls "$DISK/run/server/checkpoints" >"$RESULT/checkpoints"
rm "$DISK/filler"
"$PY" -m paxlike.deploy.flower.local "$@" --out="$DISK/run" >"$RESULT/second.out" 2>"$RESULT/second.err"
echo $? >"$RESULT/second.rc"
cp -r "$DISK/run/server" "$DISK/run/config.json" "$RESULT/"
'''


def _can_mount_tmpfs() -> bool:
  return subprocess.run(['unshare', '-rm', 'sh', '-c', 'mount -t tmpfs tmpfs /mnt'],
                        capture_output=True).returncode == 0


@pytest.mark.slow  # Two launches of a 2-node federation, the first on a disk that fills up.
def test_a_disk_that_fills_after_round_1_ends_in_one_line_and_the_same_command_resumes(
    tmp_path_factory, tmp_path):
  """--out on a 64 MiB tmpfs (mounted in a user and mount namespace of its own: no root needed)
  that a file fills once round 1 is checkpointed: the launcher exits 1 with one line naming the
  path and the last complete checkpoint (before: an OSError traceback writing runs.json); round
  1's checkpoint is intact, and once the file is removed the same command resumes from it, its
  rows the executor's uninterrupted rounds."""
  from paxlike.config import config_io
  from tests.deploy.reference import assert_rows_equal, executor_rounds
  if not _can_mount_tmpfs():
    pytest.skip('unshare -rm cannot mount a tmpfs here (user namespaces are off)')
  export, disk, result = fp.digits_export(tmp_path_factory), tmp_path / 'disk', tmp_path / 'out'
  disk.mkdir()
  result.mkdir()
  began = fp.now_ticks()
  env = {**cli_env(), 'DISK': str(disk), 'RESULT': str(result), 'PY': sys.executable}
  done = subprocess.run(['unshare', '-rm', 'sh', '-c', FULL_DISK, 'sh', *fp.CLI_TINY,
                         f'--export_dir={export}', f'--rounds={ROUNDS}', '--nodes=2',
                         '--round_timeout=90'], cwd=REPO, env=env, timeout=900,
                        capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-3000:]
  first = (result / 'first.err').read_text()
  print('df when full:', (result / 'df').read_text().strip(), '| first launch:',
        (result / 'first.rc').read_text().strip(), first.strip().splitlines()[-1:])
  assert (result / 'first.rc').read_text().strip() == '1', first[-3000:]
  assert 'Traceback' not in first, first[-3000:]
  line = first.strip().splitlines()[-1]
  assert line.startswith('paxlike.deploy.flower.local: failed: no space left on the device of '
                         f'{disk}/run'), line
  assert f'the last complete checkpoint is round 1 ({disk}/run/server/checkpoints/1)' in line
  assert '1' in (result / 'checkpoints').read_text().split()
  second = (result / 'second.err').read_text()
  assert (result / 'second.rc').read_text().strip() == '0', second[-3000:]
  assert 'resuming' in second and 'after round 1' in second, second[-3000:]
  rows = fp.rows(result / 'server' / 'metrics.jsonl')
  cohorts = fp.rows(result / 'server' / 'cohorts.jsonl')
  assert [r['step'] for r in rows] == [c['step'] for c in cohorts] == [1, 2, 3]
  assert all(c['dropped_slots'] == [] for c in cohorts)
  task = config_io.build(config_io.load_file(result / 'config.json'))
  assert_rows_equal(rows, executor_rounds(task, export, cohorts))
  assert fp.flower_processes_since(began) == []
