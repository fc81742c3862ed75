"""The latest committed state of a job dir, for `--mode=eval`, decoding and export."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paxlike.errors import UserError
from paxlike.trainer.task import Task

if TYPE_CHECKING:
  from jax.sharding import Mesh

  from paxlike.trainer.build import KeptAs, Trainer
  from paxlike.trainer.train_state import TrainState


def load_latest_state(task: Task, job_dir: Path, step: int | None = None, *,
                      evaluator: bool = True, kept_as: KeptAs | None = None
                      ) -> tuple[Trainer, int, TrainState]:
  """`task` placed on its mesh without its train step (and with its evaluator unless told
  otherwise; its programs kept as `kept_as` says: `build.setup`), and the latest committed
  step (or exactly `step`) and its state in `job_dir`."""
  from paxlike.trainer.build import setup  # pylint: disable=import-outside-toplevel
  from paxlike.trainer.checkpoint import Checkpoints  # pylint: disable=import-outside-toplevel
  trainer = setup(task, train_step=False, evaluator=evaluator, kept_as=kept_as)
  checkpoints = Checkpoints(job_dir / 'checkpoints', task.train.max_to_keep, read_only=True)
  try:
    restored = checkpoints.restore(trainer.program.abstract_state, step)
  finally:
    checkpoints.close()
  if restored is None or (step is not None and restored[0] != step):
    raise UserError(f'no checkpoint in {job_dir / "checkpoints"}; train first' if step is None
                    else f'no committed step {step} in {job_dir / "checkpoints"}')
  found, state, _ = restored
  return trainer, found, state


def export_params(trainer: Trainer, state: TrainState) -> Any:
  """The params to export (or decode): the EMA when the run keeps one (`train.ema_decay`), else
  the trained params. LoRA adapters are still separate (merge with `layers.lora.merge_lora`);
  a full fine-tune DPO's frozen reference copy is left out."""
  from paxlike.trainer import reference  # pylint: disable=import-outside-toplevel
  from paxlike.trainer.train_state import ema_params  # pylint: disable=import-outside-toplevel
  ema = ema_params(state, trainer.program.trainable)
  return reference.policy(state.alg.params if ema is None else ema)


def abstract_params(task: Task, mesh: Mesh) -> Any:
  """The model's params as abstract arrays placed on `mesh` by the task's logical rules, from
  the model alone (no data, no optimizer, nothing compiled)."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from paxlike.core import partitioning  # pylint: disable=import-outside-toplevel
  from paxlike.trainer.train_state import init_params  # pylint: disable=import-outside-toplevel
  sample = np.zeros((1, min(8, task.model.max_len)), np.int32)
  with jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.rules_for_mesh(task.mesh.rules, mesh)):
    boxed = jax.eval_shape(functools.partial(init_params, task.model, sample), jax.random.key(0))
    shardings = partitioning.logical_shardings(boxed, mesh, task.mesh.rules)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      nn.meta.unbox(boxed), shardings)


def load_latest_params(task: Task, job_dir: Path) -> tuple[Mesh, Any]:
  """(mesh, params) for decoding: the latest committed step's `alg.params` alone, restored
  onto the task's mesh (no optimizer state, no train or eval program). A run that keeps an EMA,
  or whose saved params are not the model's (an algorithm that stores more), takes the whole
  state instead (`load_latest_state`, then `export_params`)."""
  import jax  # pylint: disable=import-outside-toplevel
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  from paxlike.core import partitioning  # pylint: disable=import-outside-toplevel
  from paxlike.trainer import checkpoint  # pylint: disable=import-outside-toplevel
  directory = job_dir / 'checkpoints'
  if not directory.is_dir():
    raise UserError(f'no checkpoint in {directory}; train first')
  from paxlike.core import program_store  # pylint: disable=import-outside-toplevel
  mesh = partitioning.make_mesh(task.mesh)
  store, make = program_store.current(), functools.partial(abstract_params, task, mesh)
  want = make() if store is None else store.abstract_params(
      (repr(task.model), task.mesh.rules), mesh, make)
  checkpoint._drop_read_only_notice()  # pylint: disable=protected-access
  manager = ocp.CheckpointManager(
      directory.absolute(), options=ocp.CheckpointManagerOptions(read_only=True, create=False),
      item_handlers={'state': ocp.PyTreeCheckpointHandler(), 'meta': ocp.JsonCheckpointHandler()})
  try:
    step = manager.latest_step()
    if step is None:
      raise UserError(f'no checkpoint in {directory}; train first')
    alone = _params_alone(manager.item_metadata(step)['state'], want)
    if alone:
      item = {'alg': {'params': want}}
      args = jax.tree.map(lambda s: ocp.ArrayRestoreArgs(
          sharding=s.sharding, global_shape=s.shape, dtype=s.dtype), item)
      restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
          item=item, restore_args=args, partial_restore=True)))
  finally:
    manager.close()
  if not alone:
    trainer, _, state = load_latest_state(task, job_dir, evaluator=False)
    return trainer.program.mesh, export_params(trainer, state)
  return mesh, restored['state']['alg']['params']


def _params_alone(saved: Any, want: Any) -> bool:
  """Whether the saved state's metadata has no EMA and `alg.params` shaped as `want` (besides
  a full fine-tune DPO's frozen reference copy): then those params alone are what decoding
  uses."""
  from flax import traverse_util  # pylint: disable=import-outside-toplevel
  from paxlike.trainer import reference  # pylint: disable=import-outside-toplevel
  tree = getattr(saved, 'tree', saved)
  try:
    if 'ema' in tree.keys():
      return False
    have = reference.without_copy_names(
        traverse_util.flatten_dict(dict(tree['alg']['params']), sep='/'))
  except (AttributeError, KeyError, TypeError):
    return False
  flat = traverse_util.flatten_dict(want, sep='/')
  return have.keys() == flat.keys() and all(
      tuple(have[k].shape) == tuple(flat[k].shape) for k in flat)
