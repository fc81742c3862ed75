"""The train loop, top to bottom: init or restore → loop (step, eval, log, save) → final save.

Every algorithm (centralized or federated) is an `(init, next)` pair; the loop only feeds it
round batches `[clients, local_steps, batch, ...]` and client weights. Step s's batch and
randomness are pure functions of `(seed, s)`, so a restarted run repeats an uninterrupted one.
The plumbing lives elsewhere: `trainer_setup` places a task on its mesh and compiles its
programs, `train_state` holds the state and the step, `preemption` turns signals into a stop.
"""

import dataclasses
import functools
import time
from pathlib import Path
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from paxlike.trainer import checkpoint, evaluation, init_from, partitioning, throughput
from paxlike.federated import privacy
from paxlike.trainer.checkpoint import Checkpoints, Fallback
from paxlike.data.prefetch import Prefetcher
from paxlike.errors import RunFailure
from paxlike.trainer.preemption import StopSignal
from paxlike.trainer.summaries import RunWriter, status
from paxlike.trainer.train_state import FINITE, ema_params, with_hyperparams  # noqa: F401 (re-exported)

# The trainer's public names besides the loop's own, defined in train_state and trainer_setup:
# tests and benchmarks call train.setup(task) and read train.Setup and train.TrainState.
from paxlike.trainer.train_state import TrainState
from paxlike.trainer.build import Setup, setup  # noqa: F401 (re-exported)


# Logged as the mean over the steps since the previous row (a step's own value is noisy).
MEAN_METRICS = ('loss', 'accuracy')


@jax.jit
def _add_metrics(sums: dict, metrics: dict) -> dict:
  return jax.tree.map(jnp.add, sums, metrics)


@jax.jit
def _mean_metrics(sums: dict, count: jax.Array) -> dict:
  return jax.tree.map(lambda x: x / count, sums)


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


def evaluate_state(placed: Setup, state: TrainState
                   ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
  """`evaluation.evaluate` of the params and, with an EMA, its pooled metrics as `ema_*` (the
  same compiled eval on the EMA params; no per-client table or personalization for it)."""
  evals, clients = evaluation.evaluate(placed, state.alg)
  ema = ema_params(state, placed.trainable)
  if ema is not None:
    ema_evals, _ = evaluation.evaluate(dataclasses.replace(placed, personalized=None),
                                       state.alg._replace(params=ema))
    evals.update({f'ema_{k}': v for k, v in ema_evals.items() if k != 'clients_evaluated'})
  return evals, clients


def restore_or_init(placed: Setup, checkpoints: Checkpoints, allow_config_change: bool = False
                    ) -> tuple[int, TrainState, dict]:
  """The latest committed (step, state, metadata), or (0, a fresh state, {}). A checkpoint saved
  at another data position (seed) is refused unless the user allowed the config to change; then
  the optimizer hyperparameters (learning rates, ...) are the config's, not the checkpoint's.
  A fresh state with `train.init_from` starts from the source's params (`init_from`), with the
  optimizer state the algorithm's init of them; a resumed run never reads the source."""
  restored = checkpoints.restore(placed.abstract_state)
  if restored is not None:
    step, state, meta = restored
    if not allow_config_change:
      checkpoint.check_data_position(meta, placed.task.train.seed, step)
    elif placed.hyperparams is not None:
      with jax.set_mesh(placed.mesh):
        state = with_hyperparams(state, placed.hyperparams(jax.random.key(placed.task.train.seed)))
    status(f'resumed from checkpoint step {step}')
    return step, state, meta
  rng, source = jax.random.key(placed.task.train.seed), placed.task.train.init_from
  with jax.set_mesh(placed.mesh):
    if source is None:
      return 0, placed.init(rng), {}
    imported = init_from.load_params(source, placed.abstract_params, placed.task.model,
                                     placed.trainable)
    status(f'initialised from {source}: {len(imported)} params '
           f'({init_from.nbytes(imported) / 2**20:.1f} MiB)')
    return 0, placed.init_with(imported, rng), {}


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
  if start == 0 and cfg.init_from is not None and primary:
    init_from.write_record(job_dir, init_from.source_record(cfg.init_from))
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
    evals, clients = (evaluate_state(placed, state) if step % cfg.eval_every == 0 or last
                      else (None, None))
    if step % cfg.log_every == 0 or evals is not None:
      rate = writer.steps_per_sec(step)
      metrics = {**metrics, 'steps_per_sec': rate, **throughput.throughput_metrics(
          rate, placed.items_per_step, placed.item, placed.flops_per_device,
          placed.mesh.devices.size, peak), **privacy.round_metrics(placed.accountant, step)}
      return writer.write(step, metrics, evals, clients)
    return {}

  try:
    with (StopSignal() as stop, jax.set_mesh(placed.mesh), nn.logical_axis_rules(rules),
          Prefetcher(functools.partial(host_round, placed), start + 1) as host_rounds):
      pending = None  # (step, metrics) dispatched but not yet read back: ≤ 2 steps in flight.
      waited, row_start = 0.0, time.perf_counter()  # Blocked on the data since the last row.
      for step in range(start + 1, cfg.num_steps + 1):
        asked = time.perf_counter()
        host = host_rounds.get(step)
        waited += time.perf_counter() - asked
        state, metrics = placed.step(state, *round_inputs(placed, step, host))
        means = {k: metrics[k] for k in MEAN_METRICS if k in metrics}
        sums, count = (_add_metrics(sums, means) if count else means), count + 1
        if is_row(step):
          now = time.perf_counter()
          metrics = {**metrics, **_mean_metrics(sums, np.float32(count)),
                     'data_wait_time_fraction': waited / max(now - row_start, 1e-9)}
          sums, count, waited, row_start = {}, 0, 0.0, now
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
    try:
      checkpoints.wait()
    finally:
      checkpoints.close()
      writer.close()
  return last_row
