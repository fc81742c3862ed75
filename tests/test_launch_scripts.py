"""The launch scripts without a cluster: `--dry-run` output of the TPU and Slurm launchers, their
up-front checks, and the local launcher's fail-fast on a user error."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import REPO

SCRIPTS = REPO / 'scripts'
TRICKY = '--fdl_set=model.name=\'it\'s a "b c"\' $HOME `x` ; & *'
PAX = ['--exp=lm.StdlibTiny', TRICKY]


def run_script(name: str, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
  """Runs scripts/NAME with a clean cluster environment plus `env`."""
  base = {k: v for k, v in os.environ.items() if k not in (
      'TPU_NAME', 'ZONE', 'PROJECT', 'NUM_SLICES', 'REF', 'RUN_NAME', 'ACCELERATOR_TYPE',
      'RUNTIME_VERSION', 'XLA_FLAGS', 'LIBTPU_INIT_ARGS', 'NODES', 'GPUS_PER_NODE', 'PARTITION',
      'TIME', 'ACCOUNT', 'PROCESS_PER_NODE', 'PORT', 'DEVICES_PER_PROCESS')}
  # The scripts run the suite's own interpreter, not .venv's nor a PYTHON that `make` exported.
  base['PYTHON'] = sys.executable
  return subprocess.run(['timeout', '-s', 'KILL', str(timeout), 'bash', str(SCRIPTS / name), *args],
                        text=True, capture_output=True, env={**base, **env}, cwd=REPO)


def commands(stdout: str) -> list[list[str]]:
  """The printed commands, each parsed back into words (comment lines dropped)."""
  return [shlex.split(line) for line in stdout.splitlines() if line and not line.startswith('#')]


def flag(words: list[str], name: str) -> str:
  values = [w.split('=', 1)[1] for w in words if w.startswith(name + '=')]
  assert len(values) == 1, (name, words)
  return values[0]


TPU_ENV = {'TPU_NAME': 'my-pod', 'ZONE': 'us-east5-a', 'PROJECT': 'my-proj'}


# --- TPU pod -------------------------------------------------------------------------------------

def test_tpu_dry_run_copies_code_then_runs_on_all_workers():
  proc = run_script('launch_tpu_pod.sh', '--dry-run', '--run_name=r1', '--', *PAX, **TPU_ENV)
  assert proc.returncode == 0, proc.stderr
  tar, scp, ssh = commands(proc.stdout)
  assert tar[0] == 'tar' and '--exclude=./.venv' in tar and tar[-1] == '.'
  assert scp[:5] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'scp']
  assert scp[5:7] == [tar[2], 'my-pod:paxlike_code-r1.tar.gz']  # The tarball just made.
  assert ssh[:6] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', 'my-pod']
  for words in (scp, ssh):
    assert '--worker=all' in words
    assert flag(words, '--zone') == 'us-east5-a' and flag(words, '--project') == 'my-proj'
  remote = flag(ssh, '--command')
  assert 'python -m paxlike.main' in remote and "'jax[tpu]'" in remote
  words = shlex.split(remote)
  assert TRICKY in words, words  # Survives two rounds of quoting intact.
  assert '--job_log_dir="$HOME"/paxlike_runs/r1' in remote


def test_tpu_flags_override_the_environment():
  proc = run_script('launch_tpu_pod.sh', '--dry-run', '--tpu_name=other', '--zone', 'eu-w4',
                    '--', '--exp=x', **TPU_ENV)
  assert proc.returncode == 0, proc.stderr
  ssh = commands(proc.stdout)[-1]
  assert ssh[5] == 'other' and flag(ssh, '--zone') == 'eu-w4' and flag(ssh, '--project') == 'my-proj'


def test_tpu_default_run_name_is_a_timestamp_and_user_job_dir_wins():
  proc = run_script('launch_tpu_pod.sh', '--dry-run', '--', '--exp=x', **TPU_ENV)
  remote = flag(commands(proc.stdout)[-1], '--command')
  assert re.search(r'paxlike_runs/paxlike-\d{8}-\d{6}$', remote), remote
  proc = run_script('launch_tpu_pod.sh', '--dry-run', '--', '--exp=x', '--job_log_dir=/nfs/run 1', **TPU_ENV)
  remote = flag(commands(proc.stdout)[-1], '--command')
  assert shlex.split(remote)[-1] == '--job_log_dir=/nfs/run 1' and 'paxlike_runs' not in remote


def test_tpu_passes_xla_flags_and_libtpu_init_args_through():
  proc = run_script('launch_tpu_pod.sh', '--dry-run', '--', '--exp=x', **TPU_ENV,
                    XLA_FLAGS='--xla_dump_to=/tmp/d --xla_foo=1',
                    LIBTPU_INIT_ARGS='--xla_tpu_enable_async_collective_fusion=true')
  words = shlex.split(flag(commands(proc.stdout)[-1], '--command'))
  assert 'XLA_FLAGS=--xla_dump_to=/tmp/d --xla_foo=1' in words
  assert 'LIBTPU_INIT_ARGS=--xla_tpu_enable_async_collective_fusion=true' in words


@pytest.mark.parametrize('env, missing', [
    ({}, 'TPU_NAME, ZONE, PROJECT'),
    ({'TPU_NAME': 't', 'ZONE': 'z'}, 'PROJECT'),
    ({**TPU_ENV, 'NUM_SLICES': '2'}, 'ACCELERATOR_TYPE, RUNTIME_VERSION'),
])
def test_tpu_missing_settings_are_one_line_and_exit_2(env, missing):
  proc = run_script('launch_tpu_pod.sh', '--', '--exp=x', **env)  # Not a dry run: checked first.
  assert proc.returncode == 2
  assert proc.stdout == '' and len(proc.stderr.splitlines()) == 1, proc.stderr
  assert proc.stderr.startswith(f'launch_tpu_pod: error: missing {missing}:')


@pytest.mark.parametrize('args', [['--bogus=1', '--'], ['--num_slices=0', '--'], []])
def test_tpu_bad_usage_exits_2(args):
  proc = run_script('launch_tpu_pod.sh', *args, **TPU_ENV)
  assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr


def test_tpu_multislice_uses_queued_resources():
  proc = run_script('launch_tpu_pod.sh', '--dry-run', '--num_slices=2', '--run_name=r2',
                    '--accelerator_type=v5p-16', '--runtime_version=v2-alpha-tpuv5', '--', *PAX,
                    **TPU_ENV)
  assert proc.returncode == 0, proc.stderr
  cmds = commands(proc.stdout)
  create = next(c for c in cmds if c[4:5] == ['create'])
  assert create[:6] == ['gcloud', 'compute', 'tpus', 'queued-resources', 'create', 'my-pod']
  assert flag(create, '--node-count') == '2' and flag(create, '--accelerator-type') == 'v5p-16'
  assert flag(create, '--runtime-version') == 'v2-alpha-tpuv5' and flag(create, '--zone') == 'us-east5-a'
  scp, ssh = cmds[-2:]
  for words in (scp, ssh):
    assert words[:4] == ['gcloud', 'compute', 'tpus', 'queued-resources']
    assert '--node=all' in words and '--worker=all' in words and flag(words, '--project') == 'my-proj'
  assert ssh[4:6] == ['ssh', 'my-pod'] and TRICKY in shlex.split(flag(ssh, '--command'))


def test_tpu_ref_pip_installs_instead_of_copying():
  proc = run_script('launch_tpu_pod.sh', '--dry-run', '--ref=v1.2', '--', '--exp=x', **TPU_ENV,
                    REPO_URL='https://github.com/me/paxlike')
  cmds = commands(proc.stdout)
  assert len(cmds) == 1 and cmds[0][4] == 'ssh'
  assert 'paxlike @ git+https://github.com/me/paxlike@v1.2' in shlex.split(flag(cmds[0], '--command'))


def test_tpu_remote_command_runs_in_a_shell_with_the_exact_args(tmp_path):
  """Executes the printed remote command with bash, a fake venv and HOME: argv arrives intact."""
  proc = run_script('launch_tpu_pod.sh', '--dry-run', '--run_name=r3', '--', *PAX, **TPU_ENV,
                    XLA_FLAGS='--a=1 --b="2 3"')
  remote = flag(commands(proc.stdout)[-1], '--command')
  venv_python = tmp_path / 'paxlike_venv' / 'bin' / 'python'
  venv_python.parent.mkdir(parents=True)
  venv_python.write_text(textwrap.dedent(f'''\
      #!{sys.executable}
      import json, os, sys
      if sys.argv[1:3] == ['-m', 'paxlike.main']:
        print(json.dumps({{'argv': sys.argv[3:], 'cwd': os.getcwd(), 'xla': os.environ['XLA_FLAGS']}}))
      '''))
  venv_python.chmod(venv_python.stat().st_mode | stat.S_IXUSR)
  subprocess.run(['tar', '-czf', str(tmp_path / 'paxlike_code-r3.tar.gz'), '-C', str(REPO), 'README.md'],
                 check=True)
  out = subprocess.run(['bash', '-c', remote], text=True, capture_output=True, timeout=60,
                       env={'PATH': os.environ['PATH'], 'HOME': str(tmp_path)})
  assert out.returncode == 0, out.stderr
  got = json.loads(out.stdout)
  assert got['argv'] == [*PAX, f'--job_log_dir={tmp_path}/paxlike_runs/r3']
  assert got['cwd'] == str(tmp_path / 'paxlike_code-r3') and got['xla'] == '--a=1 --b="2 3"'
  assert (tmp_path / 'paxlike_code-r3' / 'README.md').exists()


@pytest.mark.parametrize('version,constraints', [((3, 12, 1), 'constraints.txt'),
                                                 ((3, 11, 7), 'constraints-py311.txt')])
def test_tpu_workers_install_with_the_constraints_of_their_python(tmp_path, version, constraints):
  """A worker's venv installs the set of its Python: TPU VMs ship 3.11, which jax 0.12 refuses."""
  proc = run_script('launch_tpu_pod.sh', '--dry-run', '--run_name=r4', '--', '--exp=x', **TPU_ENV)
  remote = flag(commands(proc.stdout)[-1], '--command')
  venv_python = tmp_path / 'paxlike_venv' / 'bin' / 'python'
  venv_python.parent.mkdir(parents=True)
  venv_python.write_text(textwrap.dedent(f'''\
      #!{sys.executable}
      import json, sys
      if sys.argv[1] == '-c':  # The worker's Python, as the version under test.
        sys.version_info = {version!r}
        exec(sys.argv[2])
      elif sys.argv[1:3] == ['-m', 'pip']:
        print(json.dumps(sys.argv[3:]))
      '''))
  venv_python.chmod(venv_python.stat().st_mode | stat.S_IXUSR)
  subprocess.run(['tar', '-czf', str(tmp_path / 'paxlike_code-r4.tar.gz'), '-C', str(REPO), 'README.md'],
                 check=True)
  out = subprocess.run(['bash', '-c', remote], text=True, capture_output=True, timeout=60,
                       env={'PATH': os.environ['PATH'], 'HOME': str(tmp_path)})
  assert out.returncode == 0, out.stderr
  assert json.loads(out.stdout) == ['install', '-q', '-c', constraints, '-e', '.', 'jax[tpu]']


def fake_tools(bin_dir: Path, log: Path) -> dict[str, str]:
  """gcloud and sbatch stand-ins that record their argv (one JSON list a line) and succeed.

  The fake gcloud says a queued resource does not exist until asked for its state (ACTIVE), and
  checks that the code tarball it is asked to copy holds the package.
  """
  bin_dir.mkdir()
  for name in ('gcloud', 'sbatch'):
    tool = bin_dir / name
    tool.write_text(textwrap.dedent(f'''\
        #!{sys.executable}
        import json, sys, tarfile
        args = sys.argv[1:]
        with open({str(log)!r}, 'a') as f:
          f.write(json.dumps([{name!r}, *args]) + '\\n')
        if 'describe' in args:
          if any(a.startswith('--format=') for a in args):
            print('ACTIVE')
          else:
            sys.exit(1)
        if 'scp' in args:
          assert './paxlike/main.py' in tarfile.open(args[4]).getnames()
        if {name!r} == 'sbatch':
          print('Submitted batch job 42')
        '''))
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
  return {'PATH': f'{bin_dir}:{os.environ["PATH"]}'}


@pytest.mark.parametrize('extra', [[], ['--num_slices=2', '--accelerator_type=v5p-16',
                                        '--runtime_version=v2']])
def test_tpu_real_run_issues_the_dry_run_commands(tmp_path, extra):
  log = tmp_path / 'calls.jsonl'
  env = {**TPU_ENV, **fake_tools(tmp_path / 'bin', log), 'TMPDIR': str(tmp_path)}
  args = ['--run_name=r5', *extra, '--', *PAX]
  dry = run_script('launch_tpu_pod.sh', '--dry-run', *args, **env)
  real = run_script('launch_tpu_pod.sh', *args, **env)
  assert real.returncode == 0, real.stderr
  calls = [json.loads(line) for line in log.read_text().splitlines()]
  assert [c for c in calls if c[4:5] != ['describe']] == [
      c for c in commands(dry.stdout) if c[0] == 'gcloud' and c[4] != 'describe']
  assert not list(tmp_path.glob('paxlike_code-*'))  # The local tarball is cleaned up.


def test_slurm_real_run_writes_the_script_and_submits_it(tmp_path):
  log = tmp_path / 'calls.jsonl'
  env = {**SLURM_ENV, **fake_tools(tmp_path / 'bin', log)}
  job = tmp_path / 'job'
  args = ['--run_name=r6', '--', *PAX, f'--job_log_dir={job}']
  dry = run_script('launch_slurm.sh', '--dry-run', *args, **env)
  real = run_script('launch_slurm.sh', *args, **env)
  assert real.returncode == 0, real.stderr
  assert 'Submitted batch job 42' in real.stdout
  script = job / 'logs' / 'r6.sbatch'
  assert [json.loads(line) for line in log.read_text().splitlines()] == [['sbatch', str(script)]]
  assert script.read_text() + f'sbatch {script}\n' == dry.stdout
  subprocess.run(['bash', '-n', str(script)], check=True)  # Valid shell.


@pytest.mark.skipif(shutil.which('gcloud') is None, reason='gcloud is not installed')
def test_gcloud_knows_every_flag_the_tpu_launcher_uses(tmp_path):
  """Each printed gcloud command's --flags appear in that command's own --help (offline)."""
  env = {**os.environ, 'CLOUDSDK_CONFIG': str(tmp_path), 'CLOUDSDK_CORE_DISABLE_PROMPTS': '1'}
  printed = []
  for args in (['--dry-run'], ['--dry-run', '--num_slices=2', '--accelerator_type=v5p-16',
                               '--runtime_version=v2']):
    printed += commands(run_script('launch_tpu_pod.sh', *args, '--', '--exp=x', **TPU_ENV).stdout)
  gcloud_wide = {'--project', '--format'}
  for words in (w for w in printed if w[0] == 'gcloud'):
    group = words[1:5]
    text = subprocess.run(['gcloud', *group, '--help'], text=True, capture_output=True,
                          timeout=60, env=env).stdout
    text = re.sub(r'\x1b\[[0-9;]*m', '', text)
    for word in words[5:]:
      name = word.split('=', 1)[0]
      if name.startswith('--') and name not in gcloud_wide:
        assert name in text, f'gcloud {" ".join(group)} has no {name}'


# --- Slurm ---------------------------------------------------------------------------------------

SLURM_ENV = {'NODES': '2', 'GPUS_PER_NODE': '8', 'PARTITION': 'gpu'}


def sbatch_parts(stdout: str) -> tuple[list[str], list[str], list[str]]:
  """(#SBATCH directives, srun words, sbatch command words) from a dry run's output."""
  lines = stdout.splitlines()
  directives = [l.split(None, 1)[1] for l in lines if l.startswith('#SBATCH ')]
  script = '\n'.join(lines[:-1]).replace('\\\n', ' ')
  srun = next(shlex.split(l) for l in script.splitlines() if l.startswith('srun '))
  return directives, srun, shlex.split(lines[-1])


def test_slurm_dry_run_one_process_per_gpu(tmp_path):
  job = tmp_path / 'job'
  proc = run_script('launch_slurm.sh', '--dry-run', '--time=02:00:00', '--run_name=r1', '--', *PAX,
                    f'--job_log_dir={job}', **SLURM_ENV)
  assert proc.returncode == 0, proc.stderr
  directives, srun, sbatch = sbatch_parts(proc.stdout)
  assert proc.stdout.startswith('#!/bin/bash\n')
  for d in ('--nodes=2', '--ntasks-per-node=8', '--gpus-per-task=1', '--partition=gpu',
            '--time=02:00:00', '--job-name=r1', f'--output={job}/logs/slurm-%j.out'):
    assert d in directives, directives
  assert srun[:2] == ['srun', '--kill-on-bad-exit=1'] and f'--output={job}/logs/process_%t.log' in srun
  assert srun[-len(PAX) - 3:] == ['-m', 'paxlike.main', *PAX, f'--job_log_dir={job}']
  assert 'export XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true' in proc.stdout
  assert 'export JAX_LOCAL_DEVICE_IDS=0\n' in proc.stdout
  assert sbatch == ['sbatch', f'{job}/logs/r1.sbatch']
  assert not job.exists()  # A dry run writes nothing.


def test_slurm_process_per_node_and_flags_override_env():
  proc = run_script('launch_slurm.sh', '--dry-run', '--process_per_node', '--nodes=4',
                    '--gpus_per_node', '4', '--', '--exp=x', **SLURM_ENV, XLA_FLAGS='--xla_x=1')
  directives, srun, _ = sbatch_parts(proc.stdout)
  assert {'--nodes=4', '--ntasks-per-node=1', '--gpus-per-node=4', '--partition=gpu'} <= set(directives)
  assert not any(d.startswith('--gpus-per-task') for d in directives)
  assert 'export JAX_LOCAL_DEVICE_IDS=0,1,2,3\n' in proc.stdout
  export = next(shlex.split(l) for l in proc.stdout.splitlines() if l.startswith('export XLA_FLAGS='))
  assert export == ['export', 'XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true --xla_x=1']
  assert re.fullmatch(r'--job_log_dir=.*/paxlike_runs/paxlike-\d{8}-\d{6}', srun[-1])


def test_slurm_refuses_a_job_dir_with_whitespace():
  proc = run_script('launch_slurm.sh', '--dry-run', '--', '--exp=x', '--job_log_dir=/a b', **SLURM_ENV)
  assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and 'whitespace' in proc.stderr


@pytest.mark.parametrize('env, missing', [
    ({}, 'NODES, GPUS_PER_NODE, PARTITION'),
    ({'NODES': '2', 'PARTITION': 'p'}, 'GPUS_PER_NODE'),
])
def test_slurm_missing_settings_are_one_line_and_exit_2(env, missing):
  proc = run_script('launch_slurm.sh', '--', '--exp=x', **env)
  assert proc.returncode == 2 and proc.stdout == ''
  assert len(proc.stderr.splitlines()) == 1, proc.stderr
  assert proc.stderr.startswith(f'launch_slurm: error: missing {missing}:')


def test_gpu_xla_flags_are_known_to_this_xla():
  """XLA aborts on flags it does not know: the Slurm defaults must parse (checked on CPU)."""
  text = (SCRIPTS / 'launch_slurm.sh').read_text()
  flags = re.search(r'^GPU_XLA_FLAGS="([^"]*)"', text, re.M).group(1)
  env = {**os.environ, 'XLA_FLAGS': flags, 'JAX_PLATFORMS': 'cpu'}
  out = subprocess.run([sys.executable, '-c', 'import jax; jax.numpy.ones(2).block_until_ready()'],
                       text=True, capture_output=True, timeout=120, env=env)
  assert out.returncode == 0, out.stderr[-2000:]


# --- Local ---------------------------------------------------------------------------------------

def test_local_bad_process_count_exits_2():
  proc = run_script('launch_local.sh', 'two', '--', '--exp=x')
  assert proc.returncode == 2 and 'N must be a positive integer' in proc.stderr


@pytest.mark.slow
def test_local_user_error_in_every_process_fails_fast_with_its_code(tmp_path):
  proc = run_script('launch_local.sh', '2', '--', '--exp=no.SuchExperiment',
                    f'--job_log_dir={tmp_path}', timeout=120)
  assert proc.returncode == 2, proc.stderr
  # Whichever process failed first, its one-line error reaches the terminal (process 0's
  # directly, another's as the tail of its log), and the others were stopped.
  failed = re.search(r'launch_local: process (\d) exited with code 2', proc.stderr).group(1)
  assert 'paxlike: error: ' in proc.stderr
  assert 'paxlike: error: ' in (tmp_path / 'logs' / f'process_{failed}.log').read_text()
