"""XLA:CPU's worker pool, sized so that forced host devices cannot deadlock their collectives.

`--xla_force_host_platform_device_count=N` (or JAX_NUM_CPU_DEVICES) splits the host into N CPU
devices, all served by one pool of worker threads, one per core or per device, whichever is
more. XLA:CPU hands a collective (all-reduce, all-gather) to that pool whenever other work of
its device is ready, and the collective then blocks its thread until every device of its group
has reached it. One device may have several collectives in flight at once (a DiLoCo round on a
clients x data mesh has an all-reduce over its data group beside an all-gather over its clients
group), so the pool can fill with collectives that wait for ones still in its queue: the
program hangs, and XLA aborts it 40 s later ("Termination timeout for all reduce").

With at most 2 collectives in flight per device, a pool of 2 per device always has a thread
for the one still queued, so a process that forces more CPU devices than its pool holds gets
THREADS_PER_DEVICE per device through PJRT_NPROC (the pool's size), which XLA reads when the
CPU backend starts. No more than that: the programs are the same (compiled for the core count,
not the pool), but a larger pool spends more CPU handing work between its threads. A
PJRT_NPROC of the user's own is kept: a program with more collectives in flight per device
needs a larger one. The measurements behind both: docs/benchmarks.md, "XLA:CPU's pool for
forced devices".
"""

from __future__ import annotations

import os
import re
from typing import MutableMapping

POOL_SIZE_VARIABLE = 'PJRT_NPROC'
# The collectives a device was seen to have in flight at once (an all-reduce and an all-gather).
THREADS_PER_DEVICE = 2

_DEVICE_COUNT_FLAG = re.compile(r'--xla_force_host_platform_device_count=(\d+)')


def forced_cpu_devices(environ: MutableMapping[str, str]) -> int:
  """How many CPU devices `environ` splits the host into, as jax reads it: JAX_NUM_CPU_DEVICES
  where it names a count, else XLA_FLAGS' device count flag (its last one); 1 when neither
  does."""
  jax_count = environ.get('JAX_NUM_CPU_DEVICES', '').strip()
  if jax_count.isdigit():
    return int(jax_count)
  flag_counts = _DEVICE_COUNT_FLAG.findall(environ.get('XLA_FLAGS', ''))
  return int(flag_counts[-1]) if flag_counts else 1


def pool_threads(devices: int, cores: int) -> int | None:
  """The pool size that `devices` CPU devices need on `cores` cores, or None where XLA's
  default (a thread per core or per device) already holds THREADS_PER_DEVICE per device."""
  if devices < 2 or THREADS_PER_DEVICE * devices <= cores:
    return None
  return THREADS_PER_DEVICE * devices


def usable_cores() -> int:
  """The cores this process may run on, as XLA counts them for its default pool (the affinity
  mask where the platform has one: Linux, not macOS)."""
  if hasattr(os, 'sched_getaffinity'):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def size_pool_for_forced_devices(environ: MutableMapping[str, str] = os.environ) -> int | None:
  """Sets PJRT_NPROC in `environ` to `pool_threads` for its forced devices unless it names a
  pool size already; returns the size set, or None. Takes effect only before the CPU backend
  starts (jax starts it at the first use of a device)."""
  if POOL_SIZE_VARIABLE in environ:
    return None
  threads = pool_threads(forced_cpu_devices(environ), usable_cores())
  if threads is not None:
    environ[POOL_SIZE_VARIABLE] = str(threads)
  return threads
