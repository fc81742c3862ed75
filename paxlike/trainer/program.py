"""A task's model and algorithm placed on its mesh (`Program`): the shardings, the compiled init,
the abstract (sharded) train state, and which block of each round this process loads.

`place(task)` fails, before anything is written, on everything a run can get wrong by
configuration (mesh, batch divisibility, data, model fields). The train step is compiled apart
(`compile_train_step`), so evaluation, decoding and export never pay for it. Given a `Kept`,
each program is kept compiled for the next run of the same task (core.program_store).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from paxlike.core import partitioning
from paxlike.core import program_store
from paxlike.core.algorithm import Algorithm
from paxlike.core.loss import LossFn
from paxlike.core.trainable import TrainableMask
from paxlike.errors import UserError
from paxlike.layers import pipeline
from paxlike.layers.lora import LoraSpec
from paxlike.trainer import objectives, reference
from paxlike.trainer.task import Task
from paxlike.trainer.train_state import (TrainState, finite_groups, hyperparams_of, init_params,
                                         init_state, train_step, with_hyperparams)


@dataclasses.dataclass(frozen=True)
class Kept:
  """Where a task's compiled programs are kept, and under what key: what determines them
  besides the code, the mesh, the devices and the arguments' shapes (the config they were
  built from and the data's fingerprint)."""

  store: program_store.Store
  key: tuple


def compiled(jitted: Any, args: tuple, mesh: Mesh, kept: Kept | None, name: str) -> Any:
  """`jitted.lower(*args).compile()`, kept under `name` where `kept` says (`Store.compiled`)."""
  if kept is None:
    return jitted.lower(*args).compile()
  return kept.store.compiled(jitted, args, (kept.key, name), mesh)


def made(make: Callable[[], Any], kept: Kept | None, name: str, mesh: Mesh) -> Any:
  """`make()`, kept under `name` where `kept` says (`Store.value`)."""
  if kept is None:
    return make()
  return kept.store.value((kept.key, name, program_store.mesh_key(mesh)), make)


@dataclasses.dataclass(frozen=True)
class Program:
  """A task placed on a mesh: what the loop runs, and the abstract state it restores into."""

  mesh: Mesh
  rules: Any                      # The logical axis rules resolved for `mesh`.
  algorithm: Algorithm
  loss_fn: LossFn
  init: Callable[[jax.Array], TrainState]   # rng -> a fresh state (compiled: init_state_from).
  abstract_state: TrainState      # Sharded ShapeDtypeStructs: what checkpoints restore into.
  abstract_params: Any            # The model's unboxed params as sharded ShapeDtypeStructs.
  boxed_params: Any               # The state's params' abstract values with their logical axes
                                  # (the model's, and a full fine-tune DPO's frozen copy).
  round_specs: tuple[dict, jax.ShapeDtypeStruct]  # A round's batches and weights, placed.
  eval_batch_spec: dict           # An eval batch's abstract values (the evaluator places them).
  round_shape: tuple[int, int, int]  # [clients, local_steps, batch] of a round's batches.
  block: tuple[slice, slice, slice]  # The part of round_shape this process loads.
  # rng -> the optimizer hyperparameters a fresh state gets from the config (train_state.
  # hyperparams_of), replicated; jitted, and traced on zero params: no model init.
  hyperparams: Callable[[jax.Array], dict[str, jax.Array]]
  # (params to import: {'a/b/kernel': array}, rng) -> a fresh state whose params are those
  # (the rest initialised as usual) and whose optimizer state is the algorithm's init of them.
  init_with: Callable[[dict[str, jax.Array], jax.Array], TrainState]
  trainable: TrainableMask | None = None  # params -> True on the trained leaves (None: all).
  adapters: TrainableMask | None = None   # LoRA's mask: the leaves `init_from` may lack.


def trainable_mask(task: Task) -> TrainableMask | None:
  """LoRA's `lora_mask` when the model has adapters (`model.lora_rank` > 0); every leaf but
  the frozen reference copy where the objective keeps one (a full fine-tune's DPO:
  reference.py); else None (all)."""
  if objectives.of_task(task).reference_copy(task.model, task.loss):
    return reference.policy_mask
  return adapter_mask(task)


def adapter_mask(task: Task) -> TrainableMask | None:
  """LoRA's `lora_mask` when the model has adapters (`model.lora_rank` > 0), else None."""
  return LoraSpec.of(task.model).mask


def _pipelined_model(task: Task, mesh: Mesh, batch_size: int) -> Any:
  """The model the train step runs: on a 'stage' mesh (or with train.microbatches > 1), an LM
  with `pipeline_microbatches` set, after a UserError for layers or a batch that cannot split."""
  m = task.train.microbatches
  if pipeline.stage_count(mesh) == 1 and m == 1:
    return task.model
  if not hasattr(task.model, 'pipeline_microbatches'):
    raise UserError(f"a 'stage' mesh axis and train.microbatches pipeline an LM's layers; "
                    f'{type(task.model).__name__} has none')
  pipeline.check_mesh(mesh, num_layers=task.model.num_layers, batch_size=batch_size,
                      microbatches=m, batch_axes=partitioning.BATCH_AXES)
  return task.model.clone(pipeline_microbatches=m)


def build_algorithm(task: Task, loss_fn: LossFn, trainable: TrainableMask | None) -> Any:
  """The task's algorithm; with a `trainable` mask (LoRA), the same algorithm over those leaves
  alone, the rest frozen, as the algorithm declares it can (`Algorithm.over_trainable`)."""
  algorithm = task.algorithm(loss_fn, task.optimizer)
  if trainable is None:
    return algorithm
  if algorithm.over_trainable is None:
    func = getattr(task.algorithm, 'func', task.algorithm)
    name = getattr(func, '__name__', func)
    what = ('model.lora_rank > 0 trains the adapters alone' if trainable is not
            reference.policy_mask else "a full fine-tune's DPO keeps a frozen reference copy")
    fix = ('set model.lora_rank=0' if trainable is not reference.policy_mask
           else 'set model.lora_rank > 0')
    raise UserError(f'{what}, but the algorithm {name} keeps other params (members, experts or '
                    f'control variates) and cannot freeze the base: {fix}, or use centralized '
                    f'training or a pseudo-gradient algorithm (FedAvg, FedOpt, DiLoCo)')
  return algorithm.over_trainable(trainable)


def placed_spec(x: Any, sharding: Any = None) -> jax.ShapeDtypeStruct:
  """An abstract value shaped like `x`, placed by `sharding`: what programs are compiled for."""
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


# Traced, not run: importing the trainer must not start a backend (the platform, device count
# and XLA flags stay the caller's to choose until the first real computation).
RNG_SPEC = jax.eval_shape(lambda: jax.random.key(0))


def _init_with(init: Callable[..., TrainState], params_at: Callable[[jax.Array], Any],
               finish: Callable[[Any], Any], rules: Any, imported: dict[str, jax.Array],
               rng: jax.Array, hyperparams: dict[str, jax.Array]) -> TrainState:
  """`init(rng)` from `params_at(rng)` with the leaves named in `imported` ('a/b/kernel')
  replaced (XLA drops their initialisation), then `finish`ed (a full fine-tune DPO's frozen
  copy made of them): a fresh state that starts from imported params, its optimizer
  hyperparameters `hyperparams` (init_state_from: fine-tunes that differ only in a learning
  rate or a run length share the program)."""
  def params_with(key):
    flat = traverse_util.flatten_dict(params_at(key), sep='/')
    return finish(traverse_util.unflatten_dict({**flat, **imported}, sep='/'))
  with nn.logical_axis_rules(rules):
    return init_state_from(functools.partial(init, params_at=params_with), rng, hyperparams)


def init_state_from(fresh: Callable[[jax.Array], TrainState], rng: jax.Array,
                    hyperparams: dict[str, jax.Array]) -> TrainState:
  """`fresh(rng)` with the optimizer hyperparameters at `hyperparams`' paths (train_state.
  hyperparams_of) taken from `hyperparams`. Traced so, the program holds none of the config's
  numbers there (JAX drops what computed the replaced values): runs that differ only in a
  learning rate or a run length share it."""
  return with_hyperparams(fresh(rng), hyperparams)


def _init_programs(init: Callable[..., TrainState], params_at: Callable[[jax.Array], Any],
                   boxed_params: Any, rules: Any, mesh: Mesh, kept: Kept | None
                   ) -> tuple[Any, Callable[[jax.Array], dict[str, jax.Array]]]:
  """(the compiled `init_state_from` of `init` from `params_at`, the jitted program of the
  hyperparameters it takes: traced on zero params, no model init, replicated)."""
  def zero_params_at(rng):
    return jax.tree.map(lambda x: jax.numpy.zeros(x.shape, x.dtype), nn.meta.unbox(boxed_params))

  replicated = NamedSharding(mesh, PartitionSpec())
  hyperparams = jax.jit(functools.partial(
      _fresh_hyperparams, functools.partial(init, params_at=zero_params_at), rules),
      out_shardings=replicated)
  numbers = jax.tree.map(lambda x: placed_spec(x, replicated),
                         jax.eval_shape(hyperparams, RNG_SPEC))
  return compiled(
      jax.jit(functools.partial(init_state_from, functools.partial(init, params_at=params_at))),
      (RNG_SPEC, numbers), mesh, kept, 'init'), hyperparams


def _with_configs_hyperparams(init: Callable[..., TrainState],
                              hyperparams: Callable[[jax.Array], dict], *args: Any) -> TrainState:
  """`init(*args, hyperparams(rng))`, `rng` the last of `args`: a fresh state, its
  hyperparameters the config's."""
  return init(*args, hyperparams(args[-1]))


def _fresh_hyperparams(init: Callable[[jax.Array], TrainState], rules: Any,
                       rng: jax.Array) -> dict[str, jax.Array]:
  """The hyperparameters of `init(rng)`; under jit, XLA drops the rest of the init."""
  with nn.logical_axis_rules(rules):
    return hyperparams_of(init(rng))


def _abstract_params(task: Task, sample: np.ndarray) -> Any:
  """The boxed params' abstract values; a model config its layers reject is a UserError."""
  try:
    return jax.eval_shape(functools.partial(init_params, task.model, sample), jax.random.key(0))
  except jax.errors.UnexpectedTracerError:  # A TypeError, but a bug in the code, not the config.
    raise
  except (ValueError, TypeError) as error:  # Flax layers validate their fields at trace time.
    raise UserError(f'invalid model config: {str(error).splitlines()[0]}') from None


def place(task: Task, kept: Kept | None = None) -> Program:
  """Builds the mesh and shardings of `task` (its data prepared: `DataSource.prepare`) and
  compiles its init (not its train step), kept where `kept` says."""
  mesh, data = partitioning.make_mesh(task.mesh), task.data
  spec = data.batch_spec()
  inputs = spec.eval['inputs']
  sample = np.zeros((1, *inputs.shape[1:]), inputs.dtype)  # init_params reads one row's shape.
  partitioning.check_divisible(mesh, data.num_slots, data.batch_size, inputs.shape[0])
  loss_fn = objectives.task_loss_fn(_pipelined_model(task, mesh, data.batch_size), task.loss,
                                    data)
  trainable = trainable_mask(task)
  algorithm = build_algorithm(task, loss_fn, trainable)
  rules = partitioning.rules_for_mesh(task.mesh.rules, mesh)
  batch_sharding = partitioning.round_batch_sharding(mesh)
  # A full fine-tune's DPO keeps a frozen copy of the initial params beside them (reference.py).
  keeps_copy = objectives.of_task(task).reference_copy(task.model, task.loss)
  finish = reference.attach if keeps_copy else (lambda p: p)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    model_params = made(functools.partial(_abstract_params, task, sample), kept,
                        f'abstract_params{sample.shape}', mesh)
    boxed_params = finish(model_params)
    param_shardings = partitioning.logical_shardings(boxed_params, mesh, task.mesh.rules)
    model_shardings = reference.policy(param_shardings)

    def model_params_at(rng):
      params = nn.meta.unbox(init_params(task.model, sample, rng))
      return jax.lax.with_sharding_constraint(params, model_shardings)

    def params_at(rng):
      return jax.lax.with_sharding_constraint(finish(model_params_at(rng)), param_shardings)

    init = functools.partial(init_state, algorithm=algorithm, boxed_params=boxed_params,
                             param_shardings=param_shardings, trainable=trainable,
                             ema=task.train.ema_decay is not None)
    compiled_init, hyperparams = _init_programs(init, params_at, boxed_params, rules, mesh, kept)
    state_shardings = compiled_init.output_shardings  # Propagated from the param shardings.
    abstract_state = jax.tree.map(placed_spec, compiled_init.out_info, state_shardings)
  round_shape = spec.round['mask'].shape[:3]
  return Program(
      mesh=mesh, rules=rules, algorithm=algorithm, loss_fn=loss_fn,
      init=functools.partial(_with_configs_hyperparams, compiled_init, hyperparams),
      abstract_state=abstract_state,
      abstract_params=jax.tree.map(placed_spec, nn.meta.unbox(model_params), model_shardings),
      boxed_params=boxed_params,
      round_specs=({k: placed_spec(x, batch_sharding) for k, x in spec.round.items()},
                   placed_spec(spec.weights, partitioning.client_sharding(mesh))),
      eval_batch_spec={k: placed_spec(x) for k, x in spec.eval.items()},
      round_shape=round_shape, block=partitioning.process_block(batch_sharding, round_shape),
      hyperparams=hyperparams,
      init_with=functools.partial(_with_configs_hyperparams, jax.jit(
          functools.partial(_init_with, init, model_params_at, finish, rules),
          out_shardings=state_shardings, donate_argnums=0), hyperparams),
      trainable=trainable, adapters=adapter_mask(task))


def compile_train_step(task: Task, program: Program, kept: Kept | None = None
                       ) -> Callable[..., tuple[TrainState, dict]]:
  """`step(state, batches, weights, rng) -> (state, metrics)`, compiled for `program`'s mesh
  with the state donated, kept where `kept` says."""
  state_shardings = jax.tree.map(lambda s: s.sharding, program.abstract_state)
  batches, weights = program.round_specs
  step = functools.partial(train_step, algorithm=program.algorithm,
                           skip_nonfinite=task.train.skip_nonfinite,
                           finite_groups=finite_groups(program.abstract_state.alg),
                           ema_decay=task.train.ema_decay, trainable=program.trainable)
  batch_sharding = jax.tree.map(lambda s: s.sharding, batches)
  with jax.set_mesh(program.mesh), nn.logical_axis_rules(program.rules):
    jitted = jax.jit(step, donate_argnums=0,
                     in_shardings=(state_shardings, batch_sharding, weights.sharding, None),
                     out_shardings=(state_shardings, None))
    return compiled(jitted, (program.abstract_state, batches, weights, RNG_SPEC), program.mesh,
                    kept, 'train_step')
