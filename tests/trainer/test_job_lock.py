"""One trainer per job dir: a second trainer is refused naming the first, a lock left by a dead
trainer is taken over, and eval reads while a trainer runs."""

import os
import signal
import socket
import subprocess
import time

import pytest

from paxlike.trainer import job_dir
from paxlike.errors import UserError
from tests.helpers import TINY, run_cli, start_cli

HOST = socket.gethostname()


def dead_pid() -> int:
  proc = subprocess.Popen(['true'])
  proc.wait()
  return proc.pid


def test_a_held_lock_refuses_a_second_holder_and_is_removed_on_release(tmp_path):
  with job_dir.trainer_lock(tmp_path):
    assert (tmp_path / job_dir.LOCK).read_text() == f'host {HOST} pid {os.getpid()}\n'
    with pytest.raises(UserError, match=f'^{tmp_path} is in use by another trainer '
                       rf'\(host {HOST} pid {os.getpid()}\); wait for it'):
      with job_dir.trainer_lock(tmp_path):
        pass
  assert not (tmp_path / job_dir.LOCK).exists()
  with job_dir.trainer_lock(tmp_path):  # Free again.
    pass


def test_a_lock_file_left_by_a_dead_process_is_taken_over(tmp_path, capsys):
  pid = dead_pid()
  (tmp_path / job_dir.LOCK).write_text(f'host {HOST} pid {pid}\n')
  with job_dir.trainer_lock(tmp_path):
    assert (tmp_path / job_dir.LOCK).read_text() == f'host {HOST} pid {os.getpid()}\n'
  assert capsys.readouterr().err == f'took over the trainer lock of host {HOST} pid {pid}, which has exited\n'


def test_only_the_primary_locks_and_every_process_follows_its_outcome(tmp_path):
  with job_dir.trainer_lock(tmp_path, primary=False, agree=lambda ok: True):
    assert not (tmp_path / job_dir.LOCK).exists()
  with pytest.raises(UserError, match=r'in use by another trainer \(see process 0\)$'):
    with job_dir.trainer_lock(tmp_path, primary=False, agree=lambda ok: False):
      pass
  with pytest.raises(UserError, match='in use by another trainer'):  # Primary locked, a peer not.
    with job_dir.trainer_lock(tmp_path, agree=lambda ok: False):
      pass
  assert not (tmp_path / job_dir.LOCK).exists()


@pytest.mark.slow
def test_two_trainers_on_one_job_dir(tmp_path):
  long = [*TINY, '--fdl_set=train.num_steps=100000', '--fdl_set=train.checkpoint_every=2']
  first = start_cli(*long, f'--job_log_dir={tmp_path / "job"}', stderr=tmp_path / 'first.err')
  try:
    checkpoints = tmp_path / 'job' / 'checkpoints'
    deadline = time.monotonic() + 240
    while not (checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())):
      assert first.poll() is None and time.monotonic() < deadline, (tmp_path / 'first.err').read_text()
      time.sleep(0.05)
    first.send_signal(signal.SIGSTOP)  # Holds its lock, leaves the cores to the second.
    second = run_cli(*long, f'--job_log_dir={tmp_path / "job"}', check=False)
    first.send_signal(signal.SIGCONT)
    assert second.returncode == 2
    assert second.stderr.strip() == (
        f'paxlike: error: {tmp_path / "job"} is in use by another trainer (host {HOST} pid '
        f'{first.pid}); wait for it to finish or use another --job_log_dir')
    evals = run_cli(*long, f'--job_log_dir={tmp_path / "job"}', '--mode=eval')  # Takes no lock.
    assert '"step": ' in evals.stdout
  finally:
    first.send_signal(signal.SIGKILL)
    first.wait()
  assert first.returncode == -signal.SIGKILL
  assert (tmp_path / 'job' / job_dir.LOCK).read_text() == f'host {HOST} pid {first.pid}\n'
  # The next trainer takes the dead one's lock over (and, trained past step 2, stops at once).
  third = run_cli(*TINY, '--fdl_set=train.num_steps=2', '--fdl_set=train.checkpoint_every=2',
                  '--allow_config_change', f'--job_log_dir={tmp_path / "job"}')
  assert f'took over the trainer lock of host {HOST} pid {first.pid}, which has exited' in third.stderr
  assert not (tmp_path / 'job' / job_dir.LOCK).exists()
