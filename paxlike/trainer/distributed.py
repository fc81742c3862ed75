"""Multi-process start-up with JAX's own runtime (`jax.distributed`).

Explicit flags win; otherwise a cluster environment (TPU pod, Slurm, Open MPI) is auto-detected
by JAX itself; a plain single-process run skips initialisation entirely.
"""

from __future__ import annotations

import os

import jax

from paxlike.errors import UserError

def _in_multiprocess_cluster() -> bool:
  """Whether the environment says this process is one of several (Slurm, Open MPI, TPU pod)."""
  if int(os.environ.get('SLURM_NTASKS', '1') or 1) > 1:
    return True
  if int(os.environ.get('OMPI_COMM_WORLD_SIZE', '1') or 1) > 1:
    return True
  return ',' in os.environ.get('TPU_WORKER_HOSTNAMES', '') or 'MEGASCALE_COORDINATOR_ADDRESS' in os.environ


def initialize(coordinator_address: str | None, num_processes: int | None,
               process_id: int | None, timeout_s: int, heartbeat_s: int) -> None:
  """Joins the job's processes, or does nothing for a single-process run.

  `timeout_s` bounds the wait for all processes to connect; `heartbeat_s` is how long the
  survivors wait before a dead peer makes them fail instead of hanging.
  """
  explicit = (coordinator_address, num_processes, process_id)
  if any(v is not None for v in explicit):
    if None in explicit:
      raise UserError('--coordinator_address, --num_processes and --process_id go together')
    if not 0 <= process_id < num_processes:
      raise UserError(f'--process_id={process_id} is not in [0, {num_processes})')
    if num_processes == 1:
      return
    jax.distributed.initialize(coordinator_address, num_processes, process_id,
                               initialization_timeout=timeout_s,
                               heartbeat_timeout_seconds=heartbeat_s)
  elif _in_multiprocess_cluster():
    jax.distributed.initialize(initialization_timeout=timeout_s,
                               heartbeat_timeout_seconds=heartbeat_s)


def is_primary() -> bool:
  """Whether this is process 0, the one that writes the job dir."""
  return jax.process_index() == 0


def primary_value(value: bool) -> bool:
  """Process 0's `value`, on every process (for decisions all processes must share)."""
  if jax.process_count() == 1:
    return value
  from jax.experimental import multihost_utils
  import numpy as np
  return bool(multihost_utils.broadcast_one_to_all(np.int32(value)))
