"""`Checkpoints.save` hands the state to a save thread: the caller may donate the state the
moment save returns, and a save that fails surfaces in the next call."""

import json
import shutil
import threading

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from paxlike.trainer.checkpoint import Checkpoints
from paxlike.errors import RunFailure
from tests.helpers import run_script


def _committed(directory):
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _state():
  return {'w': jnp.arange(6.0).reshape(2, 3), 'count': jnp.int32(7)}


def test_orbax_saves_in_another_thread_what_the_state_was_before_it_was_donated(
    tmp_path, monkeypatch):
  """The save thread's Orbax call is held until the caller has donated the state it saved."""
  donated, threads = threading.Event(), []
  real_save = ocp.CheckpointManager.save

  def save_after_donation(self, *args, **kwargs):
    threads.append(threading.current_thread())
    assert donated.wait(timeout=60)
    return real_save(self, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, 'save', save_after_donation)
  state = _state()
  expected = {'w': np.arange(6.0).reshape(2, 3), 'count': np.int32(7)}  # Not read from `state`.
  step = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s), donate_argnums=0)
  checkpoints = Checkpoints(tmp_path / 'checkpoints', max_to_keep=2)
  try:
    checkpoints.save(1, state, {'step': 1})
    state = step(state)  # Donates (deletes) the buffers the save was given.
    donated.set()
    checkpoints.save(2, state, {'step': 2})
    checkpoints.wait()
    assert _committed(tmp_path / 'checkpoints') == [1, 2]
    for saved, want in ((1, expected), (2, jax.tree.map(lambda x: x + 1, expected))):
      _, restored, meta = checkpoints.restore(jax.eval_shape(_state), step=saved)
      assert meta == {'step': saved}
      jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), want)
  finally:
    checkpoints.close()
  assert len(threads) == 2 and threading.main_thread() not in threads


def test_a_failed_save_raises_in_the_next_call_and_commits_nothing(tmp_path):
  checkpoints = Checkpoints(tmp_path / 'checkpoints', max_to_keep=2)
  try:
    checkpoints.save(1, _state(), {'step': 1})
    checkpoints.save(1, _state(), {'step': 'again'})  # The save thread's Orbax call refuses.
    with pytest.raises(RunFailure, match=r'checkpoint step 1 could not be saved in .*'
                       r'\(StepAlreadyExistsError: .*\); step 1 is the last intact checkpoint'):
      checkpoints.wait()
    checkpoints.save(2, _state(), {'step': 2})  # Reported once; saving goes on.
    checkpoints.wait()
    assert _committed(tmp_path / 'checkpoints') == [1, 2]
    _, _, meta = checkpoints.restore(jax.eval_shape(_state), step=1)
    assert meta == {'step': 1}  # The committed step is untouched.
  finally:
    checkpoints.close()


def test_a_reader_leaves_a_live_trainers_in_flight_save_alone(tmp_path):
  """Eval on a job dir while it trains: its in-flight save's temp dir must survive the reader
  (it did not: eval deleted it, and the trainer crashed at its next save)."""
  directory = tmp_path / 'checkpoints'
  checkpoints = Checkpoints(directory, max_to_keep=2)
  try:
    checkpoints.save(1, _state(), {'step': 1})
  finally:
    checkpoints.close()
  in_flight = directory / '2.orbax-checkpoint-tmp'
  (in_flight / 'state').mkdir(parents=True)
  reader = Checkpoints(directory, max_to_keep=2, read_only=True)
  try:
    step, restored, _ = reader.restore(jax.eval_shape(_state))
    assert step == 1 and int(restored['count']) == 7
  finally:
    reader.close()
  assert in_flight.is_dir() and _committed(directory) == [1]


def test_a_reader_restores_the_newest_step_when_the_trainer_deletes_the_one_it_listed(tmp_path):
  """Eval on a live job with max_to_keep=1: the step the reader listed is deleted by the
  trainer's next save before the reader reads it (it was reported as an unreadable step)."""
  directory = tmp_path / 'checkpoints'
  trainer = Checkpoints(directory, max_to_keep=1)
  try:
    trainer.save(1, _state(), {'step': 1})
    trainer.wait()
    reader = Checkpoints(directory, max_to_keep=1, read_only=True)  # Lists step 1.
    trainer.save(2, jax.tree.map(lambda x: x + 1, _state()), {'step': 2})
    trainer.wait()
  finally:
    trainer.close()
  assert _committed(directory) == [2]
  try:
    step, restored, meta = reader.restore(jax.eval_shape(_state))
  finally:
    reader.close()
  assert (step, meta, int(restored['count'])) == (2, {'step': 2}, 8)


def test_a_reader_opens_while_the_trainer_deletes_a_step_it_listed(tmp_path, monkeypatch):
  """The trainer deletes step 1 right after Orbax lists the steps, before it reads their commit
  times, as the reader opens (the reader crashed with FileNotFoundError)."""
  directory = tmp_path / 'checkpoints'
  trainer = Checkpoints(directory, max_to_keep=2)
  try:
    for step in (1, 2):
      trainer.save(step, _state(), {'step': step})
    trainer.wait()
  finally:
    trainer.close()
  name_format = type(ocp.path.step.standard_name_format())
  real_find_all, deleted = name_format.find_all, []

  def listed_then_step_1_deleted(self, base_path):
    listed = list(real_find_all(self, base_path))
    if not deleted:
      deleted.append(shutil.rmtree(directory / '1'))
    return iter(listed)

  monkeypatch.setattr(name_format, 'find_all', listed_then_step_1_deleted)
  reader = Checkpoints(directory, max_to_keep=2, read_only=True)
  monkeypatch.undo()
  try:
    step, _, meta = reader.restore(jax.eval_shape(_state))
  finally:
    reader.close()
  assert deleted and (step, meta) == (2, {'step': 2}) and _committed(directory) == [2]


def test_a_full_disk_is_one_line_naming_the_failed_and_the_intact_step(tmp_path, monkeypatch):
  """Orbax's write error, as tensorstore raises it on ENOSPC, becomes one line."""
  checkpoints = Checkpoints(tmp_path / 'checkpoints', max_to_keep=2)
  real_save = ocp.CheckpointManager.save

  def full_disk(self, step, *args, **kwargs):
    if step == 2:
      raise ValueError('RESOURCE_EXHAUSTED: Error writing "w/0.0" in OCDBT database: Failed to '
                       "write 4096 bytes to file 22: No space left on device [os_error_code='28']")
    return real_save(self, step, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, 'save', full_disk)
  try:
    checkpoints.save(1, _state(), {'step': 1})
    checkpoints.wait()
    checkpoints.save(2, _state(), {'step': 2})
    with pytest.raises(RunFailure) as failed:
      checkpoints.wait()
    assert str(failed.value) == (f'checkpoint step 2 could not be saved in {tmp_path}/checkpoints '
                                 '(the disk is full); step 1 is the last intact checkpoint')
  finally:
    checkpoints.close()


def test_of_two_failed_async_saves_the_first_is_the_one_reported(tmp_path, monkeypatch):
  """Failures surface at a later call; the step they name is the first that failed."""
  checkpoints = Checkpoints(tmp_path / 'checkpoints', max_to_keep=5)
  real_save = ocp.CheckpointManager.save

  def failing(self, step, *args, **kwargs):
    if step in (2, 3):
      raise OSError(f'write of step {step} failed')
    return real_save(self, step, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, 'save', failing)
  try:
    checkpoints.save(1, _state(), {'step': 1})
    checkpoints.save(2, _state(), {'step': 2})
    with pytest.raises(RunFailure) as failed:
      checkpoints.save(3, _state(), {'step': 3})  # Step 2's failure, found before step 3 starts.
      checkpoints.wait()
    assert str(failed.value).startswith('checkpoint step 2 could not be saved')
    assert 'write of step 2 failed' in str(failed.value)
    assert 'step 1 is the last intact checkpoint' in str(failed.value)
  finally:
    checkpoints.close()


REPLICA_SPLIT_SCRIPT = r'''
import json, sys, tempfile
from pathlib import Path
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jax._src import monitoring
from orbax.checkpoint._src.serialization import replica_slices
from paxlike.trainer import checkpoint
slices = []
monitoring.register_event_duration_secs_listener(lambda event, secs, **kw: slices.append(1) if (
    event.endswith('jaxpr_trace_duration') and kw.get('fun_name') == 'slice') else None)
split = []
real = replica_slices.get_replica_slices
def counted(arr, *args, **kwargs):
  found = real(arr, *args, **kwargs)
  split.append([arr.nbytes, len(found.replica_slices)])
  return found
replica_slices.get_replica_slices = counted
replicated = NamedSharding(Mesh(np.array(jax.devices()), ('data',)), P())
small = jax.device_put(jnp.ones((64, 64)), replicated)                        # 16 KiB
large = jax.device_put(jnp.ones((8 * 256, 1024)), replicated)                 # 8 MiB
directory = Path(tempfile.mkdtemp())
saver = checkpoint.Checkpoints(directory / 'small', 2)
saver.save(1, {'w': small}, {})
saver.close()
small_slices = len(slices)
saver = checkpoint.Checkpoints(directory / 'large', 2)
saver.save(1, {'w': large}, {})
saver.close()
restored = checkpoint.Checkpoints(directory / 'large', 2, read_only=True).restore(
    {'w': jax.ShapeDtypeStruct(large.shape, large.dtype, sharding=replicated)})
print(json.dumps({'small_slices': small_slices, 'split': split,
                  'equal': bool((np.asarray(restored[1]['w']) == 1).all())}))
'''


def test_only_large_replicated_arrays_are_split_among_their_replicas():
  """On 8 devices a small replicated array is written whole (no eager slice is compiled);
  one with a part of at least REPLICA_PARALLEL_MIN_BYTES per replica is split 8 ways, and
  restores whole."""
  out = json.loads(run_script(REPLICA_SPLIT_SCRIPT, devices=8).strip().splitlines()[-1])
  assert out['small_slices'] == 0
  assert out['split'] == [[64 * 64 * 4, 1], [8 * 256 * 1024 * 4, 8]]
  assert out['equal']
