"""The train loop, top to bottom: mesh → abstract state → init or restore → loop → final save.

Every algorithm (centralized or federated) is an `(init, next)` pair; the loop only feeds it
round batches `[clients, local_steps, batch, ...]` and client weights. Step s's batch and
randomness are pure functions of `(seed, s)`, so a restarted run repeats an uninterrupted one.
"""


import dataclasses
import functools
import signal
from pathlib import Path
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from paxlike import checkpoint, evaluation, losses, model_stats, partitioning, privacy, throughput
from paxlike.algorithm import Algorithm
from paxlike.checkpoint import Checkpoints, Fallback
from paxlike.data.prefetch import Prefetcher
from paxlike.data.sources import ClientEval, Item
from paxlike.errors import RunFailure, UserError
from paxlike.experiment import Task
from paxlike.summaries import RunWriter, status


# Logged as the mean over the steps since the previous row (a step's own value is noisy).
MEAN_METRICS = ('loss', 'accuracy')


@jax.jit
def _add_metrics(sums: dict, metrics: dict) -> dict:
  return jax.tree.map(jnp.add, sums, metrics)


@jax.jit
def _mean_metrics(sums: dict, count: jax.Array) -> dict:
  return jax.tree.map(lambda x: x / count, sums)


class TrainState(NamedTuple):
  """What is checkpointed: the algorithm's state and the count of skipped non-finite steps."""

  alg: Any
  nonfinite_steps: jax.Array


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
  flops_per_device: float | None  # One step's model FLOPs per device (model_stats.step_flops).
  item: Item                      # What items_per_step counts: 'tokens' or 'examples'.
  items_per_step: int
  round_shape: tuple[int, int, int]     # [clients, local_steps, batch] of a round's batches.
  block: tuple[slice, slice, slice]     # The part of round_shape this process loads.
  eval_batch_size: int
  eval_rows: slice                      # The rows of each eval batch this process loads.
  accountant: privacy.Accountant | None = None  # DP runs: the ε spent by each round.
  personalized: Callable[[Any], dict[str, float]] | None = None  # Eval after fine-tuning.


FINITE = 'finite'  # The step's metric: are its loss, grad norm and whole new state finite?


def all_finite(tree: Any) -> jax.Array:
  """Whether every floating-point value in `tree` is finite: one fused reduction."""
  leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
  return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in leaves]))


def init_params(model: nn.Module, sample: np.ndarray, rng: jax.Array) -> Any:
  """The model's (boxed) params, initialised on one row of `sample` inputs."""
  return model.init({'params': rng, 'dropout': rng}, sample[:1])['params']


def init_state(rng: jax.Array, *, algorithm: Algorithm, params_at: Callable[[jax.Array], Any],
               boxed_params: Any, param_shardings: Any) -> TrainState:
  """The algorithm's initial state from `params_at(rng)` (PAPA's members: from their own keys),
  every subtree shaped like the params (e.g. Adam's moments) sharded like them."""
  alg_state = (algorithm.init(params_at(rng)) if algorithm.seeded_init is None
               else algorithm.seeded_init(params_at, rng))
  alg_state = partitioning.constrain_like_params(alg_state, nn.meta.unbox(boxed_params),
                                                 param_shardings)
  return TrainState(alg_state, jnp.zeros((), jnp.int32))


def train_step(state: TrainState, batches: dict, weights: jax.Array, rng: jax.Array, *,
               algorithm: Algorithm, skip_nonfinite: bool) -> tuple[TrainState, dict]:
  """One round of the algorithm, and its metrics with FINITE. A non-finite round is kept out of
  the state (and counted) with `skip_nonfinite`, else the host raises before saving it."""
  alg_state, metrics = algorithm.next(state.alg, batches, weights, rng)
  new = TrainState(alg_state, state.nonfinite_steps)
  finite = all_finite((alg_state, metrics['loss'], metrics.get('grad_norm', 0.0)))
  if skip_nonfinite:
    new = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, state)
    new = new._replace(nonfinite_steps=state.nonfinite_steps + 1 - finite.astype(jnp.int32))
    metrics = {**metrics, 'nonfinite_steps': new.nonfinite_steps}
  return new, {**metrics, FINITE: finite}


def _spec(x: Any, sharding: Any = None) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


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
  algorithm = task.algorithm(loss_fn, task.optimizer)
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

    init = functools.partial(init_state, algorithm=algorithm, params_at=params_at,
                             boxed_params=boxed_params, param_shardings=param_shardings)
    compiled_init = jax.jit(init).lower(rng_spec).compile()
    state_shardings = compiled_init.output_shardings  # Propagated from the param shardings.
    abstract_state = jax.tree.map(_spec, jax.eval_shape(init, rng_spec), state_shardings)
    step = functools.partial(train_step, algorithm=algorithm,
                             skip_nonfinite=task.train.skip_nonfinite)
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
      flops_per_device=model_stats.step_flops(task.model, loss_fn, boxed_params, batches,
                                              mesh.size),
      item=data.item, items_per_step=int(batches['mask'].size), round_shape=round_shape,
      block=partitioning.process_block(batch_sharding, round_shape),
      eval_batch_size=len(sample),
      eval_rows=partitioning.process_block(eval_sharding, (len(sample),))[0],
      accountant=accountant, personalized=evaluation.personalization(task, client_eval))


class _StopSignal:
  """Turns SIGTERM/SIGINT into a flag the loop checks after each step."""

  def __init__(self):
    self.received = None
    self._previous = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def _handle(self, signum, frame):
    del frame
    self.received = signal.Signals(signum).name

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)

  def should_stop(self, step: int) -> bool:
    if jax.process_count() > 1:
      return multihost_utils.reached_preemption_sync_point(step) or self.received is not None
    return self.received is not None


def host_round(placed: Setup, step: int) -> tuple[dict, np.ndarray]:
  """This process's block of step `step`'s batches, and the client weights: a pure function of
  (seed, step)."""
  clients, _, rows = placed.block
  return placed.task.data.round_batches(placed.task.train.seed, step, clients=clients, rows=rows)


def round_inputs(placed: Setup, step: int, host: tuple[dict, np.ndarray] | None = None
                 ) -> tuple[Any, Any, jax.Array]:
  """Step `step`'s sharded batches, client weights and rng (from `host` if already fetched)."""
  batches, weights = host if host is not None else host_round(placed, step)
  batches = partitioning.block_to_global(
      batches, partitioning.round_batch_sharding(placed.mesh), placed.block, placed.round_shape)
  weights = partitioning.host_to_global(np.asarray(weights, np.float32),
                                        partitioning.client_sharding(placed.mesh))
  return batches, weights, jax.random.fold_in(jax.random.key(placed.task.train.seed), step)


def restore_or_init(placed: Setup, checkpoints: Checkpoints, allow_config_change: bool = False
                    ) -> tuple[int, TrainState, dict]:
  """The latest committed (step, state, metadata), or (0, a fresh state, {}). A checkpoint saved
  at another data position (seed) is refused unless the user allowed the config to change."""
  restored = checkpoints.restore(placed.abstract_state)
  if restored is not None:
    if not allow_config_change:
      checkpoint.check_data_position(restored[2], placed.task.train.seed, restored[0])
    status(f'resumed from checkpoint step {restored[0]}')
    return restored
  with jax.set_mesh(placed.mesh):
    return 0, placed.init(jax.random.key(placed.task.train.seed)), {}


def train(placed: Setup, job_dir: Path, *, restore_fallback: Fallback = 'off',
          allow_config_change: bool = False,
          on_start: Callable[[], None] | None = None) -> dict[str, Any]:
  """Trains `placed.task` to `train.num_steps`, resuming from `job_dir` if it holds a checkpoint.

  `on_start` runs on the primary process once the state is restored (or initialised), before
  anything is written. Returns the last metrics row. Raises RunFailure on a non-finite loss
  (nothing of the bad state is saved). SIGTERM/SIGINT save the current step and return early.
  """
  task, cfg = placed.task, placed.task.train
  primary = jax.process_index() == 0
  checkpoints = Checkpoints(job_dir / 'checkpoints', cfg.max_to_keep, fallback=restore_fallback)
  start, state, meta = restore_or_init(placed, checkpoints, allow_config_change)
  if jax.process_count() > 1:
    clients, _, rows = placed.block
    status(f'process {jax.process_index()} loads clients {clients.start}:{clients.stop}, rows '
           f'{rows.start}:{rows.stop} of each {list(placed.round_shape)} round batch')
  if on_start and primary:
    on_start()
  writer = RunWriter(job_dir, start, cfg.num_steps, primary=primary)
  rules = partitioning.rules_for_mesh(task.mesh.rules, placed.mesh)
  peak = throughput.peak_flops_per_sec(placed.mesh.devices.flat[0].device_kind)
  last_row: dict[str, Any] = {}
  # Device-side sums of MEAN_METRICS over the steps since the last row, checkpointed (exactly:
  # float32 -> JSON float -> float32) so that a resume between rows logs the uninterrupted means.
  sums = {k: np.float32(v) for k, v in meta.get('metric_sums', {}).items()}
  count = meta.get('metric_steps', 0)

  def is_row(step: int) -> bool:  # Whether `finish` writes a row for `step`.
    return step % cfg.log_every == 0 or step % cfg.eval_every == 0 or step == cfg.num_steps

  def save(step: int) -> None:
    checkpoints.save(step, state, {'step': step, 'data': checkpoint.data_position(cfg.seed, step),
                                   'metric_sums': {k: float(v) for k, v in jax.device_get(sums).items()},
                                   'metric_steps': count})

  def finish(step: int, metrics: dict) -> dict:
    """Host side of step `step`: finiteness check, eval, row, checkpoint."""
    metrics = jax.device_get(metrics)
    if not metrics.pop(FINITE) and not cfg.skip_nonfinite:  # Raised before this step is saved.
      what = ('loss' if not np.isfinite(metrics['loss']) else
              'gradient' if not np.isfinite(metrics.get('grad_norm', 0.0)) else
              'parameters or optimizer state')
      norm = f" grad_norm={float(metrics['grad_norm'])}" if 'grad_norm' in metrics else ''
      raise RunFailure(f"non-finite {what} at step {step}: loss={float(metrics['loss'])}{norm}; "
                       'the last checkpoint is untouched')
    last = step == cfg.num_steps
    evals, clients = (evaluation.evaluate(placed, state.alg) if step % cfg.eval_every == 0 or last
                      else (None, None))
    if step % cfg.log_every == 0 or evals is not None:
      rate = writer.steps_per_sec(step)
      metrics = {**metrics, 'steps_per_sec': rate, **throughput.throughput_metrics(
          rate, placed.items_per_step, placed.item, placed.flops_per_device,
          placed.mesh.devices.size, peak), **privacy.round_metrics(placed.accountant, step)}
      return writer.write(step, metrics, evals, clients)
    return {}

  try:
    with (_StopSignal() as stop, jax.set_mesh(placed.mesh), nn.logical_axis_rules(rules),
          Prefetcher(functools.partial(host_round, placed), start + 1) as host_rounds):
      pending = None  # (step, metrics) dispatched but not yet read back: ≤ 2 steps in flight.
      for step in range(start + 1, cfg.num_steps + 1):
        state, metrics = placed.step(state, *round_inputs(placed, step, host_rounds.get(step)))
        means = {k: metrics[k] for k in MEAN_METRICS if k in metrics}
        sums, count = (_add_metrics(sums, means) if count else means), count + 1
        if is_row(step):
          metrics = {**metrics, **_mean_metrics(sums, np.float32(count))}
          sums, count = {}, 0
        if pending:
          last_row = finish(*pending) or last_row
        pending = (step, metrics)
        stopping = stop.should_stop(step)
        save_now = step % cfg.checkpoint_every == 0 or step == cfg.num_steps or stopping
        if save_now or step % cfg.eval_every == 0:  # These need this step's state: sync now.
          last_row = finish(*pending) or last_row
          pending = None
        if save_now:
          save(step)
        if stopping and step < cfg.num_steps:
          status(f'{stop.received or "preempted"}: saved step {step}, exiting')
          break
      if pending:
        last_row = finish(*pending) or last_row
      if start >= cfg.num_steps:
        status(f'already trained to step {start}')
  finally:
    checkpoints.wait()
    checkpoints.close()
    writer.close()
  return last_row
