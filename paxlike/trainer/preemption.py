"""Stopping a run cleanly: SIGTERM/SIGINT, and across processes JAX's preemption sync point.

One process stops at the step its signal arrived. Several processes must stop at one common
step: the checkpoint is collective, so a process saving step n while its peer runs step n + 1
deadlocks both. JAX's preemption notifier (installed by `jax.distributed.initialize`) owns
SIGTERM there and agrees that step through the coordination service, so in a multi-process run
SIGTERM is left to it (a Python handler would replace it, and only the signalled process would
stop), and SIGINT is turned into a SIGTERM to this process, to take the same path.
"""

from __future__ import annotations

import os
import signal

import jax
from jax.experimental import multihost_utils


def _preemption_service() -> bool:
  """Whether JAX's preemption notifier agrees the stop step (a multi-process run with it on)."""
  return jax.process_count() > 1 and bool(
      getattr(jax.config, 'jax_enable_preemption_service', True))


class StopSignal:
  """Turns SIGTERM/SIGINT into a stop that the loop checks after each step."""

  def __init__(self):
    self.received: str | None = None
    self._previous: dict[signal.Signals, object] = {}

  def __enter__(self) -> StopSignal:
    shared = _preemption_service()
    for sig in (signal.SIGINT,) if shared else (signal.SIGTERM, signal.SIGINT):
      self._previous[sig] = signal.signal(sig, self._forward if shared else self._handle)
    return self

  def _handle(self, signum, frame) -> None:
    del frame
    self.received = signal.Signals(signum).name

  def _forward(self, signum, frame) -> None:
    self._handle(signum, frame)
    os.kill(os.getpid(), signal.SIGTERM)  # To JAX's notifier, which tells every process.

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():  # Only ours: JAX's SIGTERM handler stays.
      signal.signal(sig, handler)

  @property
  def reason(self) -> str:
    """What stopped the run, for its last status line."""
    return self.received or 'preempted'  # JAX's notice: a SIGTERM to any process, or the TPU's.

  def should_stop(self, step: int) -> bool:
    """Whether to save `step` and stop: on every process at the same step."""
    if _preemption_service():
      return multihost_utils.reached_preemption_sync_point(step)
    return self.received is not None
