"""XLA:CPU's worker pool grows with forced host devices (paxlike/core/cpu_pool.py): counted as
the backend's own threads in a process that imports paxlike, fresh or forked."""

import subprocess
import sys

import pytest

from paxlike.core import cpu_pool
from tests.helpers import REPO, cli_env, run_python

# Starts the CPU backend after `import paxlike`, then prints how many threads its pool has.
COUNT_POOL = '''
import os
import paxlike
import jax.numpy as jnp
jnp.ones(8).block_until_ready()
names = [open(f'/proc/self/task/{t}/comm').read().strip() for t in os.listdir('/proc/self/task')]
print(names.count('tf_XLAEigen'))
'''


def pool_size(env: dict[str, str], forked: bool) -> int:
  args = ['-c', COUNT_POOL]
  if forked:
    proc = run_python(args, env, timeout=120)
  else:
    proc = subprocess.run([sys.executable, *args], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return int(proc.stdout.split()[-1])


CORES = cpu_pool.usable_cores()


@pytest.mark.parametrize('forked', [False, True], ids=['fresh', 'forked'])
def test_eight_forced_devices_get_two_threads_each(forked):
  assert pool_size(cli_env(devices=8), forked) == max(16, CORES)


@pytest.mark.parametrize('forked', [False, True], ids=['fresh', 'forked'])
def test_one_device_and_a_users_own_size_are_left_alone(forked):
  assert pool_size(cli_env(devices=1), forked) == CORES
  assert pool_size(cli_env(devices=8, PJRT_NPROC='12'), forked) == max(12, CORES)


def test_the_device_count_is_read_as_xla_and_jax_read_it():
  flags = '--xla_force_host_platform_device_count=2 --xla_foo=1 --xla_force_host_platform_device_count=6'
  assert cpu_pool.forced_cpu_devices({'XLA_FLAGS': flags}) == 6  # The last flag wins.
  assert cpu_pool.forced_cpu_devices({'JAX_NUM_CPU_DEVICES': '5', 'XLA_FLAGS': flags}) == 5
  assert cpu_pool.forced_cpu_devices({'JAX_NUM_CPU_DEVICES': '-1', 'XLA_FLAGS': flags}) == 6
  assert cpu_pool.forced_cpu_devices({'XLA_FLAGS': '--xla_foo=1'}) == 1


def test_pool_threads_only_where_the_cores_fall_short():
  assert cpu_pool.pool_threads(devices=8, cores=2) == 16
  assert cpu_pool.pool_threads(devices=8, cores=16) is None  # XLA's default holds 2 each.
  assert cpu_pool.pool_threads(devices=1, cores=1) is None  # No collectives to wait.
  env = {'XLA_FLAGS': '--xla_force_host_platform_device_count=64'}
  assert cpu_pool.size_pool_for_forced_devices(env) == 128 and env['PJRT_NPROC'] == '128'
  assert cpu_pool.size_pool_for_forced_devices(env) is None  # Set already: kept.
