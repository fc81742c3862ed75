"""A task placed on its mesh (`Setup`): shardings, compiled init/step/eval, FLOPs, data blocks.

`setup(task)` is where everything a run can get wrong by configuration fails, before the job
dir is touched; the loop (`train.py`) then only runs what it returns.
"""

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util
from jax.sharding import Mesh

from paxlike.trainer import evaluation, losses, partitioning
from paxlike.federated import privacy
from paxlike.trainer.centralized import TrainableMask, centralized
from paxlike.data.sources import ClientEval, Item
from paxlike.errors import UserError
from paxlike.families import family_of
from paxlike.experiment import Task
from paxlike.trainer.train_state import (TrainState, finite_groups, hyperparams_of, init_params,
                                 init_state, train_step)


@dataclasses.dataclass(frozen=True)
class Setup:
  """A task placed on a mesh: its compiled functions, the abstract (sharded) train state, and
  which part of each batch this process loads."""

  task: Task
  mesh: Mesh
  init: Callable[[jax.Array], TrainState]
  step: Callable[..., tuple[TrainState, dict]]
  eval: Callable[[Any, dict, jax.Array], evaluation.Outputs]  # (alg state, batch, groups).
  client_eval: ClientEval | None  # How eval splits into clients' held-out metrics.
  abstract_state: TrainState
  flops_per_device: float | None  # One step's model FLOPs per device (the family's step_flops).
  item: Item                      # What items_per_step counts: 'tokens' or 'examples'.
  items_per_step: int
  round_shape: tuple[int, int, int]     # [clients, local_steps, batch] of a round's batches.
  block: tuple[slice, slice, slice]     # The part of round_shape this process loads.
  eval_batch_size: int
  eval_rows: slice                      # The rows of each eval batch this process loads.
  accountant: privacy.Accountant | None = None  # DP runs: the ε spent by each round.
  personalized: Callable[[Any], dict[str, float]] | None = None  # Eval after fine-tuning.
  # rng -> the optimizer hyperparameters a fresh state gets from the config (train_state.
  # hyperparams_of); jitted, not compiled until a resume with a changed config asks for them.
  hyperparams: Callable[[jax.Array], dict[str, jax.Array]] | None = None
  # (params to import: {'a/b/kernel': array}, rng) -> a fresh state whose params are those
  # (the rest initialised as usual) and whose optimizer state is the algorithm's init of them.
  init_with: Callable[[dict[str, jax.Array], jax.Array], TrainState] | None = None
  abstract_params: Any = None     # The unboxed params as sharded ShapeDtypeStructs.
  trainable: TrainableMask | None = None  # LoRA: params -> True on the trained leaves.


def trainable_mask(task: Task) -> TrainableMask | None:
  """LoRA's `lora_mask` when the model has adapters (`model.lora_rank` > 0), else None."""
  if not getattr(task.model, 'lora_rank', 0):
    return None
  from paxlike.layers.lora import lora_mask  # pylint: disable=import-outside-toplevel
  return lora_mask


def build_algorithm(task: Task, loss_fn: losses.LossFn, trainable: TrainableMask | None) -> Any:
  """The task's algorithm; with a `trainable` mask (LoRA) only centralized training, which
  trains just those leaves, is allowed (federated LoRA is not built yet)."""
  if trainable is None:
    return task.algorithm(loss_fn, task.optimizer)
  if getattr(task.algorithm, 'func', None) is not centralized:
    name = getattr(getattr(task.algorithm, 'func', task.algorithm), '__name__', task.algorithm)
    raise UserError(f'model.lora_rank > 0 trains adapters with centralized training only; the '
                    f'algorithm {name} cannot freeze the base yet: set model.lora_rank=0')
  return task.algorithm(loss_fn, task.optimizer, trainable=trainable)


def _init_with(init_args: dict, params_at: Callable[[jax.Array], Any], rules: Any, mesh: Mesh,
               imported: dict[str, jax.Array], rng: jax.Array) -> TrainState:
  """`init_state(rng)` from `params_at(rng)` with the leaves named in `imported` ('a/b/kernel')
  replaced (XLA drops their initialisation): a fresh state that starts from imported params."""
  def params_with(key):
    flat = traverse_util.flatten_dict(params_at(key), sep='/')
    return traverse_util.unflatten_dict({**flat, **imported}, sep='/')
  with nn.logical_axis_rules(partitioning.rules_for_mesh(rules, mesh)):
    return init_state(rng, params_at=params_with, **init_args)


def _spec(x: Any, sharding: Any = None) -> jax.ShapeDtypeStruct:
  """An abstract value shaped like `x`, placed by `sharding`: what programs are compiled for."""
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def _fresh_hyperparams(init: Callable[[jax.Array], TrainState], rules: Any, mesh: Mesh,
                       rng: jax.Array) -> dict[str, jax.Array]:
  """The hyperparameters of `init(rng)`; under jit, XLA drops the rest of the init."""
  with nn.logical_axis_rules(partitioning.rules_for_mesh(rules, mesh)):
    return hyperparams_of(init(rng))


def setup(task: Task) -> Setup:
  """Builds the mesh and shardings, and compiles init, the train step and eval for `task`.

  Everything a run can get wrong by configuration (mesh, batch divisibility, data, model
  fields) fails here, before anything is written.
  """
  mesh, data = partitioning.make_mesh(task.mesh), task.data
  accountant = privacy.checked_accountant(task)  # Refuses a run over its privacy budget.
  batches, weights = data.round_batches(task.train.seed, 1)
  eval_batch = data.eval_batches()[0]
  sample = eval_batch['inputs']
  partitioning.check_divisible(mesh, data.clients_per_round, data.batch_size, len(sample))
  loss_fn = losses.model_loss_fn(task.model)
  trainable = trainable_mask(task)
  algorithm = build_algorithm(task, loss_fn, trainable)
  ema = task.train.ema_decay is not None
  client_eval = data.client_eval()
  rng_spec = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
  batch_sharding = partitioning.round_batch_sharding(mesh)
  client_sharding = partitioning.client_sharding(mesh)
  eval_sharding = partitioning.eval_batch_sharding(mesh)
  with jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.rules_for_mesh(task.mesh.rules, mesh)):
    try:
      boxed_params = jax.eval_shape(functools.partial(init_params, task.model, sample),
                                    jax.random.key(0))
    except (ValueError, TypeError) as error:  # Flax layers validate their fields at trace time.
      raise UserError(f'invalid model config: {str(error).splitlines()[0]}') from None
    param_shardings = partitioning.logical_shardings(boxed_params, mesh, task.mesh.rules)

    def params_at(rng):
      params = nn.meta.unbox(init_params(task.model, sample, rng))
      return jax.lax.with_sharding_constraint(params, param_shardings)

    init_args = dict(algorithm=algorithm, boxed_params=boxed_params,
                     param_shardings=param_shardings, trainable=trainable, ema=ema)
    init = functools.partial(init_state, params_at=params_at, **init_args)
    compiled_init = jax.jit(init).lower(rng_spec).compile()
    state_shardings = compiled_init.output_shardings  # Propagated from the param shardings.
    abstract_state = jax.tree.map(_spec, jax.eval_shape(init, rng_spec), state_shardings)
    step = functools.partial(train_step, algorithm=algorithm,
                             skip_nonfinite=task.train.skip_nonfinite,
                             finite_groups=finite_groups(abstract_state.alg),
                             ema_decay=task.train.ema_decay, trainable=trainable)
    compiled_step = jax.jit(step, donate_argnums=0,
                            in_shardings=(state_shardings, batch_sharding, client_sharding, None),
                            out_shardings=(state_shardings, None)).lower(
        abstract_state, jax.tree.map(lambda x: _spec(x, batch_sharding), batches),
        _spec(np.asarray(weights, np.float32), client_sharding), rng_spec).compile()
    eval_step = evaluation.eval_step(task.model, data.item,
                                     client_eval.num_groups if client_eval else 1,
                                     algorithm.ensemble)
    compiled_eval = jax.jit(eval_step).lower(
        abstract_state.alg, jax.tree.map(lambda x: _spec(x, eval_sharding), eval_batch),
        _spec(np.zeros(eval_batch['mask'].shape, np.int32), eval_sharding)).compile()
  round_shape = batches['mask'].shape[:3]
  return Setup(
      task=task, mesh=mesh, init=compiled_init, step=compiled_step, eval=compiled_eval,
      client_eval=client_eval, abstract_state=abstract_state,
      flops_per_device=family_of(task.model).step_flops(task.model, loss_fn, boxed_params,
                                                         batches, mesh.size),
      item=data.item, items_per_step=int(batches['mask'].size), round_shape=round_shape,
      block=partitioning.process_block(batch_sharding, round_shape),
      eval_batch_size=len(sample),
      eval_rows=partitioning.process_block(eval_sharding, (len(sample),))[0],
      accountant=accountant, personalized=evaluation.personalization(task, client_eval),
      hyperparams=jax.jit(functools.partial(_fresh_hyperparams, init, task.mesh.rules, mesh),
                          out_shardings={path: spec.sharding for path, spec
                                         in hyperparams_of(abstract_state).items()}),
      init_with=jax.jit(functools.partial(_init_with, init_args, params_at, task.mesh.rules,
                                          mesh),
                        out_shardings=state_shardings, donate_argnums=0),
      abstract_params=jax.tree.map(_spec, nn.meta.unbox(boxed_params), param_shardings),
      trainable=trainable)
