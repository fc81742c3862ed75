"""Orbax checkpoints of the train state plus a small JSON of run metadata (step, data position).

Saves are async and atomic: Orbax writes into a temp dir and commits by rename, so a kill at any
moment leaves only committed steps visible; stale temp dirs are cleaned up on open. Even the
start of a save (Orbax's per-array Python work and the device-to-host copy) runs off the train
loop, in a save thread, on a device copy of the state that later steps cannot donate away. Restores
check every leaf's shape and dtype against the abstract state first, so a changed model is a
clear error instead of a silent reshape.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from paxlike.errors import RunFailure, UserError
from paxlike.trainer.restore_fallback import FALLBACKS, Fallback

# Orbax splits an array whose shards are replicated (data parallelism) among the replicas, so
# that each writes a part. Each part is an eager slice on a device: one compile per shape and
# device the first time, then a dispatch per save. Below this many bytes per part that costs more
# than the write it shares out (every parameter of a small model would be sliced 8 ways on 8
# devices), so such arrays are written whole by their first replica, as Orbax writes every array
# by default on GPUs. Large arrays are still split.
REPLICA_PARALLEL_MIN_BYTES = 1 << 20
# A reader (eval on a live job) lists the steps while the trainer deletes the oldest (max_to_keep):
# a step listed can be gone before it is read. The reader then lists again, this many times at most.
RELISTS = 5


class Checkpoints:
  """The job's checkpoint directory: restore the latest committed step, async save."""

  def __init__(self, directory: Path, max_to_keep: int, fallback: Fallback = 'off',
               read_only: bool = False):
    """`read_only` (eval, decode, export): restore only, and leave the temp dirs of a live
    trainer's in-flight saves alone; only the trainer, holding the job-dir lock, cleans them."""
    assert fallback in FALLBACKS, fallback
    assert not (read_only and fallback != 'off'), 'a reader moves no damaged step aside'
    self.fallback = fallback
    # A reader's options are already what Orbax would force, so it warns about none of them.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=None if read_only else max_to_keep, read_only=read_only,
        save_interval_steps=0 if read_only else 1, create=not read_only,
        cleanup_tmp_directories=not read_only, enable_async_checkpointing=True,
        enable_background_delete=True)  # Old steps are deleted off the train thread.
    if read_only:
      _drop_read_only_notice()
    else:  # A failed save's noise can start in Orbax's threads before the loop sees the error.
      _quiet_closed_loop_noise()
      _split_only_large_replicated_arrays()
    self._directory = Path(directory).absolute()
    self._manager = _relisting_vanished_steps(lambda: ocp.CheckpointManager(
        self._directory, options=options, item_handlers={
            'state': ocp.StandardCheckpointHandler(), 'meta': ocp.JsonCheckpointHandler()}),
        self._directory)
    # One process: saves start in this thread, in order. Several: in the caller's thread, so
    # every process runs Orbax's cross-process barriers in the same order as its steps.
    self._saver = (concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='checkpoint')
                   if jax.process_count() == 1 else None)
    # The step whose save the thread is starting, and its future.
    self._started: tuple[int, concurrent.futures.Future] | None = None
    self._unconfirmed: list[int] = []  # Steps whose saves started but may not have committed.
    self._failed: RunFailure | None = None  # The last failed save (close skips Orbax's then).

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[int, Any, dict] | None:
    """(step, state, meta) from `step` (default: the latest committed), or None when there is none.

    A corrupt step is a RunFailure naming it. With a `fallback`, older steps are tried instead,
    and the corrupt ones are moved aside to `checkpoints.corrupt/` (kept, out of Orbax's way);
    when none is readable, only 'from_scratch' moves them and returns None, else RunFailure.
    A step deleted while it is read (a live trainer's max_to_keep) is not corrupt: the steps are
    listed again, and the newest is read.
    """
    corrupt, relists = [], 0
    steps = self._steps_to_try(step, corrupt)
    while steps:
      candidate = steps.pop(0)
      try:
        restored = (candidate, *self._restore_step(candidate, abstract_state))
      except UserError:
        raise
      except Exception as error:  # Orbax/tensorstore raise many kinds for damaged files.
        if not (self._directory / str(candidate)).exists() and relists < RELISTS:
          relists += 1
          _relisting_vanished_steps(self._manager.reload, self._directory)
          steps = self._steps_to_try(step, corrupt)
          continue
        _quiet_closed_loop_noise()
        message = (f'checkpoint step {candidate} in {self._directory} is unreadable '
                   f'({type(error).__name__}: {_first_line(error)})')
        if self.fallback == 'off':
          raise RunFailure(message + '; pass --restore_fallback to use the previous good step') from error
        logging.warning('%s; falling back to an earlier step', message)
        corrupt.append(candidate)
        continue
      self._move_aside(corrupt)
      return restored
    if corrupt and self.fallback != 'from_scratch':
      raise RunFailure(f'every checkpoint step in {self._directory} is unreadable '
                       f'(steps {", ".join(map(str, corrupt))}); pass '
                       '--restore_fallback=from_scratch to move them aside and start from step 0')
    if corrupt:
      logging.warning('every checkpoint step is unreadable (%s): moved aside, starting from step 0',
                      ', '.join(map(str, corrupt)))
    self._move_aside(corrupt)
    return None

  def _steps_to_try(self, step: int | None, corrupt: list[int]) -> list[int]:
    """The committed steps up to `step` (all when None), newest first, less `corrupt`."""
    return [s for s in sorted(self._manager.all_steps(), reverse=True)
            if (step is None or s <= step) and s not in corrupt]

  def _move_aside(self, steps: list[int]) -> None:
    if not steps or jax.process_index() != 0:
      return
    directory = self._directory
    aside = directory.with_name(directory.name + '.corrupt')
    aside.mkdir(exist_ok=True)
    for step in steps:
      (directory / str(step)).rename(aside / str(step))
    self._manager.reload()

  def _restore_step(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
    saved = self._manager.item_metadata(step)['state']
    _check_matches(saved, abstract_state, step)
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
    return restored['state'], dict(restored['meta'])

  def save(self, step: int, state: Any, meta: dict) -> None:
    """Starts an async save of `state` at `step`. Returns once a device copy of `state` is
    dispatched (the caller may donate `state` to the next step); the save thread then copies
    it to host and Orbax writes and commits it. Raises the error of a previous failed save, as
    a one-line RunFailure (a full disk says so) naming the step and the last intact one."""
    self._check_started()
    args = ocp.args.Composite(state=ocp.args.StandardSave(_copy(state)),
                              meta=ocp.args.JsonSave(meta))
    self._unconfirmed.append(step)
    if self._saver is None:
      self._reporting_failure(self._manager.save, step, args=args, force=True, failed_step=step)
    else:
      self._started = step, self._saver.submit(self._manager.save, step, args=args, force=True)

  def _check_started(self) -> None:
    """Waits for the save thread's current start, raising its error if it failed."""
    started, self._started = self._started, None
    if started is not None:
      step, future = started
      self._reporting_failure(future.result, failed_step=step)
    self._reporting_failure(self._manager.check_for_errors)  # A finished save that failed.

  def _reporting_failure(self, fn, *args, failed_step: int | None = None, **kwargs) -> Any:
    """`fn(*args, **kwargs)`, its error (Orbax's or tensorstore's) made a one-line RunFailure
    about `failed_step`, else (a background commit's error) the oldest save that did not commit
    once the saves in flight have finished: the first failure is the one reported."""
    try:
      return fn(*args, **kwargs)
    except Exception as error:  # Orbax and tensorstore raise many kinds for failed writes.
      directory = self._directory
      with contextlib.suppress(Exception):  # The saves in flight, so `committed` is final.
        self._manager.wait_until_finished()
      committed = sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())
      failed = failed_step if failed_step is not None else next(
          (s for s in self._unconfirmed if s not in committed),
          self._unconfirmed[-1] if self._unconfirmed else None)
      self._unconfirmed = [s for s in self._unconfirmed if failed is not None and s > failed]
      self._failed = RunFailure(_failure_message(error, directory, failed, committed))
      raise self._failed from error

  def wait(self) -> None:
    """Blocks until every started save has committed."""
    self._check_started()
    self._reporting_failure(self._manager.wait_until_finished)
    self._unconfirmed.clear()

  def close(self) -> None:
    try:
      if self._failed is None:
        self._check_started()
    finally:
      if self._saver is not None:
        self._saver.shutdown(wait=True)
      if self._failed is None:
        self._manager.close()


def _relisting_vanished_steps(list_steps: Callable[[], Any], directory: Path) -> Any:
  """`list_steps()` (Orbax reading every step's metadata), called again while it fails on a step
  of `directory` deleted between Orbax listing it and reading it, RELISTS times at most."""
  for attempt in range(RELISTS + 1):
    try:
      return list_steps()
    except FileNotFoundError as error:
      if attempt == RELISTS or directory not in Path(error.filename or '/').parents:
        raise


def _failure_message(error: BaseException, directory: Path, failed: int | None,
                     committed: list[int]) -> str:
  """One line: which step failed, why (a full disk says so), and which one is intact."""
  chain = _chain(error)
  why = ('the disk is full' if any('No space left on device' in str(e)
                                   or getattr(e, 'errno', None) == errno.ENOSPC for e in chain)
         else f'{type(error).__name__}: {_first_line(error)}')
  intact = (f'step {committed[-1]} is the last intact checkpoint' if committed
            else 'no checkpoint is saved yet')
  return f'checkpoint step {failed} could not be saved in {directory} ({why}); {intact}'


def _chain(error: BaseException) -> list[BaseException]:
  """`error` and its causes and contexts."""
  seen = []
  while error is not None and error not in seen:
    seen.append(error)
    error = error.__cause__ or error.__context__
  return seen


@jax.jit
def _copy(tree: Any) -> Any:
  """A device copy of every array in `tree`, in the same sharding: new buffers, so a step
  that donates `tree` leaves the copy intact."""
  return jax.tree.map(jnp.copy, tree)


def _split_only_large_replicated_arrays() -> None:
  """Registers Orbax's jax.Array handler with REPLICA_PARALLEL_MIN_BYTES (else as Orbax's
  default one: its metadata store, and no splitting on GPUs)."""
  if isinstance(ocp.type_handlers.get_type_handler(jax.Array), _LargeSlicesArrayHandler):
    return
  # Orbax exports no name for the metadata store its default handler is made with.
  from orbax.checkpoint._src.metadata import array_metadata_store  # pylint: disable=import-outside-toplevel
  handler = _LargeSlicesArrayHandler(array_metadata_store=array_metadata_store.Store(),
                                     min_slice_bytes_for_replica_parallel=REPLICA_PARALLEL_MIN_BYTES)
  absl_logger = logging.getLogger('absl')
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)  # Orbax warns of any override: this one is on purpose.
  try:
    ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
  finally:
    absl_logger.setLevel(level)


class _LargeSlicesArrayHandler(ocp.type_handlers.ArrayHandler):
  """Orbax's jax.Array handler, registered by `_split_only_large_replicated_arrays`."""


def _drop_read_only_notice() -> None:
  """Orbax logs 'Given directory is read only' on every read-only open: eval, decode and export
  open one on purpose, and their errors must stay one line."""
  absl_logger = logging.getLogger('absl')
  if not any(isinstance(f, _ReadOnlyNoticeFilter) for f in absl_logger.filters):
    absl_logger.addFilter(_ReadOnlyNoticeFilter())


class _ReadOnlyNoticeFilter(logging.Filter):

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith('Given directory is read only')


def _is_closed_loop_noise(exc_type: type, exc_value: BaseException) -> bool:
  return exc_type is RuntimeError and str(exc_value) == 'Event loop is closed'


def _quiet_closed_loop_noise() -> None:
  """After a failed restore or save, Orbax's tensorstore callbacks keep posting to an asyncio
  loop it has closed, and Python prints each 'Event loop is closed' as a traceback (unraisable,
  or uncaught in a callback) at random moments, burying (and splitting) the one line that
  matters; Orbax also logs the failed write's traceback, which the RunFailure reports in one
  line. Drop exactly those."""
  if getattr(sys.unraisablehook, 'paxlike_quiet', False):
    return
  unraisable_default, except_default = sys.unraisablehook, sys.excepthook

  def unraisable(info):
    if not _is_closed_loop_noise(info.exc_type, info.exc_value):
      unraisable_default(info)

  def excepthook(exc_type, exc_value, tb):
    if not _is_closed_loop_noise(exc_type, exc_value):
      except_default(exc_type, exc_value, tb)

  unraisable.paxlike_quiet = True
  sys.unraisablehook, sys.excepthook = unraisable, excepthook
  logging.getLogger('absl').addFilter(_FailedWriteLogFilter())


class _FailedWriteLogFilter(logging.Filter):
  """Orbax's error logs of a failed save: each is the error that `Checkpoints` raises, as a
  RunFailure of one line, with a traceback of Orbax's threads."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.levelno >= logging.ERROR and f'{os.sep}orbax{os.sep}' in record.pathname)


def data_position(seed: int, step: int) -> dict[str, int]:
  """Where the data stream stands after `step`: its batches are pure functions of (seed, step)."""
  return {'seed': seed, 'next_step': step + 1}


def check_data_position(meta: dict, seed: int, step: int) -> None:
  """Refuses a restored `step` whose saved data position is not where this run would continue."""
  saved, expected = meta.get('data'), data_position(seed, step)
  if saved is not None and saved != expected:
    raise UserError(f'checkpoint step {step} was saved at data position {saved}, but this run '
                    f'continues at {expected}; restore with its train.seed or use a new job dir')


def _leaves_by_name(tree: Any) -> dict[str, Any]:
  """`{'alg.opt_state.1.mu': leaf}`: the same names for a train state and Orbax's metadata of it."""
  def part(key):
    for attr in ('name', 'key', 'idx'):
      if hasattr(key, attr):
        return str(getattr(key, attr))
    return str(key)
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {'.'.join(part(k) for k in path): leaf for path, leaf in flat}


def _check_matches(saved: Any, abstract_state: Any, step: int) -> None:
  """UserError unless the saved tree has the abstract state's leaves, shapes and dtypes."""
  have, wanted = _leaves_by_name(saved), _leaves_by_name(abstract_state)
  extra = sorted(set(have) - set(wanted))
  if extra:
    raise UserError(f'checkpoint step {step} has {extra[0]}, which the configured run lacks; '
                    'the train state changed since it was saved (another optimizer or algorithm?)')
  for name, want in wanted.items():
    if name not in have:
      raise UserError(f'checkpoint step {step} has no {name}; the train state changed since it '
                      'was saved (another model, optimizer or algorithm?)')
    got = have[name]
    if tuple(got.shape) != tuple(want.shape) or np.dtype(got.dtype) != np.dtype(want.dtype):
      raise UserError(f'checkpoint step {step}: {name} is {got.dtype}{list(got.shape)} but the '
                      f'configured run needs {want.dtype}{list(want.shape)}; did the model change?')


def _first_line(error: BaseException) -> str:
  return (str(error).strip().splitlines() or [''])[0][:200]
