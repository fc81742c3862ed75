"""What the Flower tests do to a running local federation from outside: wait for its rows, find
its processes by command line, kill them, and start a node of their own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from paxlike.deploy.flower import processes as processes_lib
from tests.forked_cli import ForkedProcess
from tests.helpers import REPO, cli_env, made_once, run_cli, run_python, start_python

# DigitsFedAvg at test size: 5 clients, 3 a round of 2 local steps on batches of 8.
CLI_TINY = ['--exp=federated.DigitsFedAvg', '--fdl_set=data.clients_per_round=3',
            '--fdl_set=data.local_steps=2', '--fdl_set=data.batch_size=8',
            '--fdl_set=data.num_clients=5']
EXPORT_ROUNDS = 4


def digits_export(tmp_path_factory) -> Path:
  """CLI_TINY's export of EXPORT_ROUNDS rounds, made once per pytest run (the local and the
  secure federations both run it)."""
  def make(out: Path) -> None:
    made = run_python(['-m', 'paxlike.export', *CLI_TINY, f'--out={out}',
                       f'--rounds={EXPORT_ROUNDS}'], cli_env(), timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
  return made_once(tmp_path_factory, 'flower_digits_export', make)


LORA_ROUNDS = 2
LORA_CLIENTS = 3  # SecAgg+ needs 3 nodes (secure.MIN_NODES), each holding a client.


def lora_flags(root: Path) -> list[str]:
  """TextLoraFedAvg at test size (tests/federated/lora_task.py) for LORA_ROUNDS rounds on
  LORA_CLIENTS clients, all every round, the text files root/corpus/K (data.partition=file)."""
  from tests.federated.lora_task import SMALL
  return ['--exp=federated.TextLoraFedAvg', *(f'--fdl_set={o}' for o in SMALL),
          f'--fdl_set=data.files={root}/corpus/*/corpus.txt', '--fdl_set=data.partition=file',
          f'--fdl_set=data.clients_per_round={LORA_CLIENTS}',
          f'--fdl_set=train.num_steps={LORA_ROUNDS}']


def lora_run(tmp_path_factory) -> tuple[list[str], Path, Path]:
  """(lora_flags, their export of LORA_ROUNDS rounds, the job dir of `python -m paxlike.main`
  on them), made once per pytest run: the plain and the secure LoRA federations both run that
  export and compare their rows with that job's."""
  from tests.federated.lora_task import write_corpus

  def make(root: Path) -> None:
    for k in range(LORA_CLIENTS):
      (root / 'corpus' / str(k)).mkdir(parents=True)
      write_corpus(root / 'corpus' / str(k))
    made = run_python(['-m', 'paxlike.export', *lora_flags(root), f'--out={root / "export"}',
                       f'--rounds={LORA_ROUNDS}'], cli_env(), timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    run_cli(*lora_flags(root), f'--job_log_dir={root / "job"}', timeout=300)
  root = made_once(tmp_path_factory, 'flower_lora_run', make)
  return lora_flags(root), root / 'export', root / 'job'


SUPERNODE_MARKERS = ('flower-supernode', 'paxlike.deploy.flower.supernode')
FLOWER_MARKERS = ('flower-superlink', *SUPERNODE_MARKERS, 'flower-superexec', 'flwr-serverapp',
                  'flwr-clientapp', 'flwr run', 'warm_clientapp')  # Its forks: its cmdline.


def processes() -> dict[int, tuple[int, str, float]]:
  """{pid: (parent pid, command line, start time in clock ticks)} of every process now."""
  found = {}
  for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
      cmdline = Path(f'/proc/{pid}/cmdline').read_bytes().replace(b'\0', b' ').decode()
      stat = Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()
    except OSError:
      continue
    if stat[0] != 'Z':  # A zombie has exited: only its parent's wait is missing.
      found[int(pid)] = (int(stat[1]), cmdline, float(stat[19]))
  return found


def flower_processes_since(ticks: float) -> list[str]:
  """Command lines of live Flower processes started after `ticks` (clock ticks since boot) by
  this pytest worker."""
  return [cmd for pid, (_, cmd, start) in processes().items()
          if start >= ticks and any(m in cmd for m in FLOWER_MARKERS) and of_this_worker(pid)]


def of_this_worker(pid: int) -> bool:
  """Whether process `pid` descends from this pytest worker (its environment names the worker
  and the test run, tests/deploy/conftest.py): under -n, another worker's Flower processes run
  at the same time, and another pytest run's may too."""
  marks = [f'{name}={os.environ[name]}'.encode()
           for name in ('PYTEST_XDIST_WORKER', 'PAXLIKE_TEST_RUN') if name in os.environ]
  if not marks:
    return True
  try:
    env = Path(f'/proc/{pid}/environ').read_bytes().split(b'\0')
  except OSError:
    return False  # Gone since it was listed.
  return all(mark in env for mark in marks)


def now_ticks() -> float:
  return time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf('SC_CLK_TCK')


def wait_until(predicate, timeout: float, what: str,
               proc: subprocess.Popen | ForkedProcess | None = None) -> None:
  """Polls `predicate` until true; AssertionError after `timeout` s or when `proc` exits."""
  deadline = time.monotonic() + timeout
  while not predicate():
    assert time.monotonic() < deadline, f'timed out waiting for {what}'
    assert proc is None or proc.poll() is None, f'the launcher exited before {what}'
    time.sleep(0.2)


def rows(path: Path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def kill_server_app(out: Path) -> int:
  """SIGKILLs the flwr-serverapp process of the federation in `out` (its superexec's parent
  is that federation's SuperLink); its pid."""
  procs = processes()
  link = next(pid for pid, (_, cmd, _) in procs.items()
              if 'flower-superlink' in cmd and str(out) in cmd)
  for pid, (parent, cmd, _) in procs.items():
    if 'flwr-serverapp' in cmd and procs.get(parent, (0,))[0] == link:
      os.kill(pid, signal.SIGKILL)
      return pid
  raise AssertionError('no ServerApp process is running')


def kill_node(out: Path, name: str, sig: int = signal.SIGKILL) -> int:
  """Sends `sig` (SIGKILL unless told) to SuperNode `name` of the federation in `out`; its
  pid."""
  for pid, (_, cmd, _) in processes().items():
    if any(m in cmd for m in SUPERNODE_MARKERS) and f'{out}/logs/{name}.jsonl' in cmd:
      os.kill(pid, sig)
      return pid
  raise AssertionError(f'no SuperNode {name} is running')


def start_group(args: list[str], log: Path, env: dict[str, str] | None = None
                ) -> subprocess.Popen | ForkedProcess:
  """`args` in a new session (stopped with `stop_group`), output to `log`: `python ARGS` forked
  from the worker's fork server where it can be (the local launcher, the warm ClientApp
  server), as tests.helpers.start_python does."""
  if args[0] == sys.executable:
    return start_python(args[1:], env or cli_env(), log, log, new_session=True)
  with open(log, 'w') as f:
    return subprocess.Popen(args, cwd=REPO, env=env or cli_env(), stdout=f,
                            stderr=subprocess.STDOUT, start_new_session=True)


def stop_group(proc: subprocess.Popen | ForkedProcess) -> None:
  """SIGKILLs `proc`'s session and every process below it: the local launcher starts Flower's
  processes in sessions of their own, which a launcher killed mid-run (a failed test) would
  leave running."""
  processes_lib.kill_tree(proc)


def flwr(*args: str, home: Path) -> subprocess.CompletedProcess:
  """The `flwr` CLI with FLWR_HOME `home`."""
  env = {**cli_env(), 'FLWR_HOME': str(home), 'FLWR_DISABLE_UPDATE_CHECK': '1',
         'FLWR_TELEMETRY_ENABLED': '0'}
  return subprocess.run([str(Path(sys.executable).parent / 'flwr'), *args], env=env, text=True,
                        capture_output=True, timeout=120)
