"""The train loop, top to bottom: mesh → abstract state → init or restore → loop → final save.

Every algorithm (centralized or federated) is an `(init, next)` pair; the loop only feeds it
round batches `[clients, local_steps, batch, ...]` and client weights. Step s's batch and
randomness are pure functions of `(seed, s)`, so a restarted run repeats an uninterrupted one.
"""


import dataclasses
import functools
import math
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
from paxlike.checkpoint import Checkpoints, Fallback
from paxlike.data.prefetch import Prefetcher
from paxlike.data.sources import ClientEval
from paxlike.errors import RunFailure, UserError
from paxlike.experiment import Task
from paxlike.layers import TransformerLM
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


@dataclasses.dataclass
class Setup:
  """A task placed on a mesh: its jitted functions and the abstract (sharded) train state."""

  task: Task
  mesh: Mesh
  init: Callable[[jax.Array], TrainState]
  step: Callable[..., tuple[TrainState, dict]]
  eval: Callable[[Any, dict, jax.Array], evaluation.Outputs]  # (alg state, batch, groups).
  client_eval: ClientEval | None  # How eval splits into clients' held-out metrics.
  abstract_state: TrainState
  flops_per_device: float | None   # One step's model FLOPs per device (LMs: 6N + attention
                                   # per token; else XLA's count of one micro-batch's gradient
                                   # times clients × local steps: XLA sees a loop body once).
  items_per_step: tuple[str, int]  # ('tokens', n) for LMs, ('examples', n) otherwise.
  round_shape: tuple[int, int, int]     # [clients, local_steps, batch] of a round's batches.
  block: tuple[slice, slice, slice]     # The part of round_shape this process loads.
  eval_rows: tuple[int, slice]          # Eval batch size, and the rows this process loads.
  accountant: privacy.Accountant | None = None  # DP runs: the ε spent by each round.
  personalized: Callable[[Any], dict[str, float]] | None = None  # Eval after fine-tuning.


def setup(task: Task) -> Setup:
  """Builds the mesh and shardings, and compiles init and the train step for `task`.

  Everything a run can get wrong by configuration (mesh, batch divisibility, data, model
  fields) fails here, before anything is written.
  """
  mesh = partitioning.make_mesh(task.mesh)
  data = task.data
  accountant = privacy.checked_accountant(task)  # Refuses a run over its privacy budget.
  batches, weights = data.round_batches(task.train.seed, 1)
  eval_batch = data.eval_batches()[0]
  sample = eval_batch['inputs']
  partitioning.check_divisible(mesh, data.clients_per_round, data.batch_size, len(sample))
  algorithm = task.algorithm(losses.model_loss_fn(task.model), task.optimizer)

  def init_params(rng):
    return task.model.init({'params': rng, 'dropout': rng}, sample[:1])['params']

  def init(rng):
    def params_at(key):
      return jax.lax.with_sharding_constraint(nn.meta.unbox(init_params(key)), param_shardings)
    alg_state = (algorithm.init(params_at(rng)) if algorithm.seeded_init is None
                 else algorithm.seeded_init(params_at, rng))
    alg_state = partitioning.constrain_like_params(alg_state, nn.meta.unbox(boxed_params),
                                                   param_shardings)
    return TrainState(alg_state, jnp.zeros((), jnp.int32))

  def train_step(state, batches, weights, rng):
    alg_state, metrics = algorithm.next(state.alg, batches, weights, rng)
    new = TrainState(alg_state, state.nonfinite_steps)
    finite = all_finite((alg_state, metrics['loss'], metrics.get('grad_norm', 0.0)))
    if task.train.skip_nonfinite:
      new = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, state)
      new = new._replace(nonfinite_steps=state.nonfinite_steps + 1 - finite.astype(jnp.int32))
      metrics = {**metrics, 'nonfinite_steps': new.nonfinite_steps}
    return new, {**metrics, FINITE: finite}

  def spec(x, sharding):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

  rng_spec = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
  batch_sharding = partitioning.round_batch_sharding(mesh)
  client_sharding = partitioning.client_sharding(mesh)
  eval_sharding = partitioning.eval_batch_sharding(mesh)
  client_eval = data.client_eval()
  eval_step = evaluation.eval_step(task.model, data.item,
                                   client_eval.num_groups if client_eval else 1, algorithm.ensemble)
  with jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.rules_for_mesh(task.mesh.rules, mesh)):
    try:
      boxed_params = jax.eval_shape(init_params, jax.random.key(0))
    except (ValueError, TypeError) as error:  # Flax layers validate their fields at trace time.
      raise UserError(f'invalid model config: {str(error).splitlines()[0]}') from None
    param_shardings = partitioning.logical_shardings(boxed_params, mesh, task.mesh.rules)
    compiled_init = jax.jit(init).lower(rng_spec).compile()
    state_shardings = compiled_init.output_shardings  # Propagated from the param shardings.
    abstract_state = jax.tree.map(spec, jax.eval_shape(init, rng_spec), state_shardings)
    step = jax.jit(train_step, donate_argnums=0,
                   in_shardings=(state_shardings, batch_sharding, client_sharding, None),
                   out_shardings=(state_shardings, None)).lower(
                       abstract_state, jax.tree.map(lambda x: spec(x, batch_sharding), batches),
                       spec(np.asarray(weights, np.float32), client_sharding), rng_spec).compile()
    compiled_eval = jax.jit(eval_step).lower(
        abstract_state.alg, jax.tree.map(lambda x: spec(x, eval_sharding), eval_batch),
        spec(np.zeros(eval_batch['mask'].shape, np.int32), eval_sharding)).compile()
  round_shape = batches['mask'].shape[:3]
  items = int(batches['mask'].size)
  if isinstance(task.model, TransformerLM):  # Model FLOPs; XLA counts a loop body only once.
    flops = model_stats.flops_per_token(task.model, batches['inputs'].shape[-1]) * items / mesh.size
  else:
    flops = gradient_flops(losses.model_loss_fn(task.model), nn.meta.unbox(boxed_params),
                           jax.tree.map(lambda x: x[0, 0], batches))
    flops = flops and flops * math.prod(round_shape[:2]) / mesh.size
  eval_rows = partitioning.process_block(eval_sharding, (len(sample),))
  return Setup(task, mesh, compiled_init, step, compiled_eval, client_eval, abstract_state,
               flops, (data.item, items), round_shape,
               partitioning.process_block(batch_sharding, round_shape), (len(sample), *eval_rows),
               accountant, evaluation.personalization(task, client_eval))


FINITE = 'finite'  # The step's metric: are its loss, grad norm and whole new state finite?


def all_finite(tree: Any) -> jax.Array:
  """Whether every floating-point value in `tree` is finite: one fused reduction."""
  leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
  return jnp.all(jnp.stack([jnp.isfinite(x).all() for x in leaves]))


def gradient_flops(loss_fn: losses.LossFn, params: Any, batch: dict) -> float | None:
  """XLA's FLOP count of one loss-and-gradient evaluation on `batch`, on one device."""
  rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
  grad_fn = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
  return throughput.step_flops_per_device(grad_fn.lower(params, batch, rng).compile())


def evaluate(s: Setup, alg_state: Any) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
  """Held-out metrics of `alg_state.params` (and of the algorithm's ensemble): pooled loss and
  accuracy plus per-client summaries, and the per-client table (see evaluation.finish)."""
  size, rows = s.eval_rows
  batches = s.task.data.eval_batches(rows=rows)
  groups = ([g[rows] for g in s.client_eval.groups] if s.client_eval else
            [np.zeros(b['mask'].shape, np.int32) for b in batches])
  sharding, totals = partitioning.eval_batch_sharding(s.mesh), None
  for batch, group in zip(batches, groups):
    batch, group = partitioning.block_to_global((batch, group), sharding, (rows,), (size,))
    totals = evaluation.combine(totals, s.eval(alg_state, batch, group))
  metrics, table = evaluation.finish(totals, s.client_eval)
  if s.personalized is not None:
    metrics.update(s.personalized(alg_state.params))
  return metrics, table


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


def host_round(s: Setup, step: int) -> tuple[dict, np.ndarray]:
  """This process's block of step `step`'s batches, and the client weights: a pure function of
  (seed, step)."""
  clients, _, rows = s.block
  return s.task.data.round_batches(s.task.train.seed, step, clients=clients, rows=rows)


def round_inputs(s: Setup, step: int, host: tuple[dict, np.ndarray] | None = None
                 ) -> tuple[Any, Any, jax.Array]:
  """Step `step`'s sharded batches, client weights and rng (from `host` if already fetched)."""
  batches, weights = host if host is not None else host_round(s, step)
  batches = partitioning.block_to_global(
      batches, partitioning.round_batch_sharding(s.mesh), s.block, s.round_shape)
  weights = partitioning.host_to_global(np.asarray(weights, np.float32),
                                        partitioning.client_sharding(s.mesh))
  return batches, weights, jax.random.fold_in(jax.random.key(s.task.train.seed), step)


def restore_or_init(s: Setup, checkpoints: Checkpoints) -> tuple[int, TrainState, dict]:
  """The latest committed (step, state, metadata), or (0, a fresh state, {})."""
  restored = checkpoints.restore(s.abstract_state)
  if restored is not None:
    checkpoint.check_data_position(restored[2], s.task.train.seed, restored[0])
    status(f'resumed from checkpoint step {restored[0]}')
    return restored
  with jax.set_mesh(s.mesh):
    return 0, s.init(jax.random.key(s.task.train.seed)), {}


def train(s: Setup, job_dir: Path, *, restore_fallback: Fallback = 'off',
          on_start: Callable[[], None] | None = None) -> dict[str, Any]:
  """Trains `s.task` to `train.num_steps`, resuming from `job_dir` if it holds a checkpoint.

  `on_start` runs on the primary process once the state is restored (or initialised), before
  anything is written. Returns the last metrics row. Raises RunFailure on a non-finite loss
  (nothing of the bad state is saved). SIGTERM/SIGINT save the current step and return early.
  """
  task, cfg = s.task, s.task.train
  primary = jax.process_index() == 0
  checkpoints = Checkpoints(job_dir / 'checkpoints', cfg.max_to_keep, fallback=restore_fallback)
  start, state, meta = restore_or_init(s, checkpoints)
  if jax.process_count() > 1:
    clients, _, rows = s.block
    status(f'process {jax.process_index()} loads clients {clients.start}:{clients.stop}, rows '
           f'{rows.start}:{rows.stop} of each {list(s.round_shape)} round batch')
  if on_start and primary:
    on_start()
  writer = RunWriter(job_dir, start, cfg.num_steps, primary=primary)
  rules = partitioning.rules_for_mesh(task.mesh.rules, s.mesh)
  peak = throughput.peak_flops_per_sec(s.mesh.devices.flat[0].device_kind)
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
    evals, clients = (evaluate(s, state.alg) if step % cfg.eval_every == 0 or last
                      else (None, None))
    if step % cfg.log_every == 0 or evals is not None:
      rate = writer.steps_per_sec(step)
      metrics = {**metrics, 'steps_per_sec': rate, **throughput.throughput_metrics(
          rate, s.items_per_step[1], s.items_per_step[0], s.flops_per_device,
          s.mesh.devices.size, peak), **privacy.round_metrics(s.accountant, step)}
      return writer.write(step, metrics, evals, clients)
    return {}

  try:
    with (_StopSignal() as stop, jax.set_mesh(s.mesh), nn.logical_axis_rules(rules),
          Prefetcher(functools.partial(host_round, s), start + 1) as host_rounds):
      pending = None  # (step, metrics) dispatched but not yet read back: ≤ 2 steps in flight.
      for step in range(start + 1, cfg.num_steps + 1):
        state, metrics = s.step(state, *round_inputs(s, step, host_rounds.get(step)))
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


def load_latest_state(task: Task, job_dir: Path) -> tuple[Setup, int, TrainState]:
  """The setup and latest committed state of a job dir, for eval and decode."""
  s = setup(task)
  checkpoints = Checkpoints(job_dir / 'checkpoints', task.train.max_to_keep)
  try:
    restored = checkpoints.restore(s.abstract_state)
  finally:
    checkpoints.close()
  if restored is None:
    raise UserError(f'no checkpoint in {job_dir / "checkpoints"}; train first')
  step, state, _ = restored
  return s, step, state
