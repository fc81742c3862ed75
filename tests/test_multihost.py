"""Several processes on loopback (jax.distributed, 2 processes × 4 forced CPU devices) through
scripts/launch_local.sh: the same rows as one 8-device process, collective checkpoints that
survive kill -9, fail-fast when a peer dies, and SIGTERM saving one common step.

Every process tree runs in its own session and is SIGKILLed as a group on timeout or at teardown:
JAX's preemption notifier catches SIGTERM, so nothing softer is a hard limit. It also agrees the
step at which every process stops, however the signal reached them.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, TINY, cli_env, made_once, metric_rows, run_cli

pytestmark = pytest.mark.slow

LAUNCH = REPO / 'scripts' / 'launch_local.sh'
# Runs to be interrupted: long, with a metrics row (the sign that training runs) every step.
LONG = ('--fdl_set=train.num_steps=100000', '--fdl_set=train.log_every=1')


class Job:
  """A process tree started in its own session; its output goes to files (pipes could fill)."""

  def __init__(self, argv: list[str], out_dir: Path, env: dict[str, str] | None = None):
    self.out, self.err = out_dir / 'launcher.out', out_dir / 'launcher.err'
    # launch_local.sh runs the suite's own interpreter, not its default (.venv's, the Python 3.12
    # set, whichever set the suite runs on), nor a PYTHON that `make` left in the environment.
    env = env or {**os.environ, 'PYTHON': sys.executable}
    with open(self.out, 'w') as out, open(self.err, 'w') as err:
      self.proc = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=err, env=env,
                                   start_new_session=True)

  def wait(self, timeout: float) -> int:
    """The exit code; on timeout the whole tree is SIGKILLed and the test fails."""
    try:
      return self.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      self.kill()
      pytest.fail(f'still running after {timeout} s; stderr tail:\n{self.stderr()[-3000:]}')

  def kill(self) -> None:
    try:
      os.killpg(self.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    self.proc.wait()

  def stderr(self) -> str:
    return self.err.read_text()


@pytest.fixture
def jobs():
  """Starts Jobs; SIGKILLs every process group they made at teardown, whatever happened."""
  started: list[Job] = []

  def start(argv, out_dir, env=None) -> Job:
    started.append(Job([str(a) for a in argv], out_dir, env))
    return started[-1]

  yield start
  for job in started:
    job.kill()


def launch_argv(job_dir: Path, *args: str, exp_args=TINY) -> list:
  return ['bash', LAUNCH, 2, '--', *exp_args, f'--job_log_dir={job_dir}', *args]


def training_launch(jobs, tmp_path: Path) -> tuple[Job, Path]:
  """A 2-process launch of an endless run, once its first metrics row is written."""
  job_dir = tmp_path / 'job'
  job = jobs(launch_argv(job_dir, *LONG), tmp_path)
  wait_for(lambda: has_rows(job_dir) or job.proc.poll() is not None, 180, 'the first metrics row')
  return job, job_dir


def process_1_pid(job: Job, job_dir: Path) -> int:
  victim = paxlike_pids(job_dir, process_id=1)
  assert len(victim) == 1, job.stderr()[-2000:]
  return victim[0]


def saved_step(line: str) -> int:
  """N of a `...: saved step N, exiting` status line."""
  return int(line.split('saved step ')[1].split(',')[0])


def launch(job_dir: Path, *args: str, timeout: float = 240, exp_args=TINY) -> str:
  """An uninterrupted 2-process launch_local.sh run to completion (exit 0 asserted); its stderr."""
  out_dir = Path(f'{job_dir}.launch{time.monotonic_ns()}')
  out_dir.mkdir(parents=True)
  job = Job([str(a) for a in launch_argv(job_dir, *args, exp_args=exp_args)], out_dir)
  try:
    code = job.wait(timeout)
  finally:
    job.kill()
  assert code == 0, job.stderr()[-3000:]
  return job.stderr()


def wait_for(condition, timeout: float, what: str, poll: float = 0.05) -> None:
  deadline = time.monotonic() + timeout
  while not condition():
    if time.monotonic() > deadline:
      pytest.fail(f'timed out after {timeout} s waiting for {what}')
    time.sleep(poll)


def committed(job_dir: Path, step: int) -> bool:
  """Whether Orbax has committed `step` (renamed from its temp dir) in the job dir."""
  ckpt = job_dir / 'checkpoints'
  return (ckpt / str(step)).is_dir() and not any(
      p.name.startswith(f'{step}.orbax-checkpoint-tmp') for p in ckpt.iterdir())


def has_rows(job_dir: Path) -> bool:
  path = job_dir / 'metrics.jsonl'
  return path.exists() and path.stat().st_size > 0


def paxlike_pids(job_dir: Path, process_id: int | None = None) -> list[int]:
  """Pids of live paxlike processes of this job dir (optionally only `--process_id=N`)."""
  pids = []
  for entry in Path('/proc').iterdir():
    if not entry.name.isdigit():
      continue
    try:
      argv = (entry / 'cmdline').read_bytes().split(b'\0')
      state = (entry / 'stat').read_text().rsplit(')', 1)[1].split()[0]
    except OSError:
      continue
    argv = [a.decode(errors='replace') for a in argv]
    if (state != 'Z' and 'paxlike.main' in argv and f'--job_log_dir={job_dir}' in argv and
        (process_id is None or f'--process_id={process_id}' in argv)):
      pids.append(int(entry.name))
  return pids


def assert_rows_close(rows: list[dict], expected: list[dict], rel: float = 1e-4) -> None:
  assert [r['step'] for r in rows] == [r['step'] for r in expected]
  for row, want in zip(rows, expected):
    assert row.keys() == want.keys()
    assert row == pytest.approx(want, rel=rel), row['step']


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def mkdir(path: Path) -> Path:
  path.mkdir(parents=True, exist_ok=True)
  return path


@pytest.fixture(scope='module')
def single8(tmp_path_factory):
  """The reference: one process with 8 forced CPU devices."""
  job = tmp_path_factory.mktemp('single8')
  run_cli(*TINY, f'--job_log_dir={job}', devices=8)
  return job


@pytest.fixture(scope='module')
def two_processes(tmp_path_factory):
  """The same run as 2 processes × 4 devices through launch_local.sh, and its stderr."""
  made = made_once(tmp_path_factory, 'two_processes', lambda d: (
      d.mkdir(), (d / 'stderr').write_text(launch(d / 'job'))))
  return made / 'job', (made / 'stderr').read_text()


def test_two_processes_match_one_process_with_eight_devices(single8, two_processes):
  job, stderr = two_processes
  assert 'launch_local: 2 processes x 4 CPU devices' in stderr
  assert 'step 20/20' in stderr  # Process 0's progress reaches the terminal.
  assert_rows_close(metric_rows(job), metric_rows(single8))
  logs = job / 'logs'
  assert sorted(p.name for p in logs.iterdir()) == ['process_0.log', 'process_1.log']
  assert 'step 20/20' in (logs / 'process_0.log').read_text()
  assert 'step 20/20' not in (logs / 'process_1.log').read_text()  # Only process 0 reports.
  for i in (0, 1):  # Each process loads only its half of every batch (data axis over both).
    found = re.search(r'process (\d) loads clients 0:1, rows (\d+):(\d+) of each \[1, 1, (\d+)\]',
                      (logs / f'process_{i}.log').read_text())
    assert found, f'process {i} does not say what it loads'
    index, start, stop, batch = map(int, found.groups())
    assert (index, start, stop) == (i, i * batch // 2, (i + 1) * batch // 2)
  assert {'config.json', 'config.txt', 'metrics.jsonl', 'summaries'} <= {p.name for p in job.iterdir()}
  assert committed(job, 10) and committed(job, 20)


def test_kill_9_of_all_processes_then_restart_resumes_from_the_collective_checkpoint(
    two_processes, jobs, tmp_path):
  expected, _ = two_processes
  job_dir = tmp_path / 'job'
  # The same run made endless (its schedule kept the 20-step one): it cannot end first.
  job = jobs(launch_argv(job_dir, '--fdl_set=train.num_steps=100000',
                         '--fdl_set=optimizer.learning_rate.decay_steps=20'), tmp_path)
  wait_for(lambda: committed(job_dir, 10) or job.proc.poll() is not None, 180, 'checkpoint 10')
  job.kill()  # SIGKILL to the launcher and both processes at once.
  assert job.proc.returncode == -signal.SIGKILL, job.stderr()[-2000:]
  wait_for(lambda: not paxlike_pids(job_dir), 10, 'the killed processes to go')
  latest = max(int(p.name) for p in (job_dir / 'checkpoints').iterdir() if p.name.isdigit())
  stderr = launch(job_dir, '--allow_config_change', f'--fdl_set=train.num_steps={max(latest, 20)}')
  assert f'resumed from checkpoint step {latest}' in stderr
  rows = [r for r in metric_rows(job_dir) if r['step'] <= 20]
  assert_rows_close(rows, metric_rows(expected), rel=1e-6)


def test_killing_one_process_makes_the_launcher_fail_fast(jobs, tmp_path):
  job, job_dir = training_launch(jobs, tmp_path)
  os.kill(process_1_pid(job, job_dir), signal.SIGKILL)
  killed_at = time.monotonic()
  code = job.wait(timeout=120)
  elapsed = time.monotonic() - killed_at
  print(f'launcher exited {code} {elapsed:.1f} s after process 1 was killed')
  assert code != 0 and elapsed < 120
  assert 'process 1 was killed by SIGKILL' in job.stderr()
  wait_for(lambda: not paxlike_pids(job_dir), 10, 'the survivor to be stopped too')


def test_survivor_exits_on_its_own_within_the_heartbeat_timeout(jobs, tmp_path):
  """Without the launcher's help, JAX's coordination service stops a process whose peer died."""
  job_dir = tmp_path / 'job'
  env = cli_env(devices=4, JAX_PLATFORMS='cpu')
  port = free_port()
  procs = [jobs([sys.executable, '-m', 'paxlike.main', *TINY, *LONG, f'--job_log_dir={job_dir}',
                 f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2', f'--process_id={i}',
                 '--heartbeat_timeout=10'], mkdir(tmp_path / f'p{i}'), env) for i in (0, 1)]
  wait_for(lambda: has_rows(job_dir) or procs[0].proc.poll() is not None, 180, 'the first row')
  procs[1].kill()
  killed_at = time.monotonic()
  code = procs[0].wait(timeout=300)  # Its 100,000 steps take hours: only a dead peer ends it.
  elapsed = time.monotonic() - killed_at
  print(f'process 0 exited {code} {elapsed:.1f} s after process 1 was killed (heartbeat 10 s)')
  assert code != 0 and 'step 100000/100000' not in procs[0].stderr()


def test_sigterm_to_the_launcher_saves_one_common_step_and_exits_0(jobs, tmp_path):
  job, job_dir = training_launch(jobs, tmp_path)
  job.proc.send_signal(signal.SIGTERM)  # The launcher only; it forwards to its processes.
  assert job.wait(timeout=90) == 0, job.stderr()[-3000:]
  saved = [line for line in job.stderr().splitlines() if line.startswith('preempted: saved step')]
  assert len(saved) == 1, job.stderr()[-3000:]
  assert committed(job_dir, saved_step(saved[0]))
  assert saved[0] in (job_dir / 'logs' / 'process_1.log').read_text()  # The same step there.


def test_a_signal_to_one_process_stops_both_at_one_common_step(jobs, tmp_path):
  # Process 1 alone is told (SIGINT, which takes SIGTERM's path through JAX's preemption
  # notifier): if it stopped alone, its collective save would wait on process 0 forever.
  job, job_dir = training_launch(jobs, tmp_path)
  os.kill(process_1_pid(job, job_dir), signal.SIGINT)
  assert job.wait(timeout=120) == 0, job.stderr()[-3000:]
  saved = [line for line in job.stderr().splitlines() if ': saved step' in line]
  assert len(saved) == 1 and saved[0].startswith('preempted: saved step'), job.stderr()[-3000:]
  step = saved_step(saved[0])
  assert committed(job_dir, step)
  assert f'SIGINT: saved step {step}, exiting' in (job_dir / 'logs' / 'process_1.log').read_text()


def test_federated_clients_axis_spread_over_two_processes(tmp_path):
  # A cohort of 4 that splits over the 2-way 'clients' axis; the reference is one process.
  args = ['--exp=federated.DigitsFedAvg', '--fdl_fiddler=tiny', '--fdl_set=data.clients_per_round=4',
          '--fdl_set=train.num_steps=2', '--fdl_set=train.log_every=1', '--fdl_set=mesh.ici=(2,4)',
          "--fdl_set=mesh.axes=('clients','data')"]
  job_dir = tmp_path / 'job'
  launch(job_dir, exp_args=args)
  run_cli(*args, f'--job_log_dir={tmp_path / "single8"}', devices=8)
  rows = metric_rows(job_dir)
  assert [r['step'] for r in rows] == [1, 2] and rows[-1]['clients'] == 4
  assert_rows_close(rows, metric_rows(tmp_path / 'single8'))
  for i in (0, 1):  # The 2-way clients axis spans the processes: each loads half the cohort.
    log = (job_dir / 'logs' / f'process_{i}.log').read_text()
    assert f'process {i} loads clients {2 * i}:{2 * i + 2}, rows 0:' in log, log[-2000:]


def test_processes_do_not_outlive_a_killed_launcher(jobs, tmp_path):
  job_dir = tmp_path / 'job'
  job = jobs(launch_argv(job_dir, *LONG), tmp_path)
  wait_for(lambda: len(paxlike_pids(job_dir)) == 2 or job.proc.poll() is not None, 60, 'both processes')
  os.kill(job.proc.pid, signal.SIGKILL)  # The launcher alone: it has no chance to clean up.
  wait_for(lambda: not paxlike_pids(job_dir), 30, 'the orphaned processes to die')
