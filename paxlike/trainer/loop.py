"""The train loop, top to bottom: init or restore → loop (step, eval, log, save) → final save.

Every algorithm (centralized or federated) is an `(init, next)` pair; the loop only feeds it
round batches `[clients, local_steps, batch, ...]` and client weights. Step s's batch and
randomness are pure functions of `(seed, s)`, so a restarted run repeats an uninterrupted one.
The plumbing lives elsewhere: `build` places a task on its mesh and compiles its programs
(`program`, `evaluator`, `reporters`), `train_state` holds the state and the step, `preemption`
turns signals into a stop.
"""

import functools
import time
from pathlib import Path
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from paxlike.data.prefetch import Prefetcher
from paxlike.errors import RunFailure
from paxlike.trainer.task import Task
from paxlike.core import partitioning
from paxlike.trainer import checkpoint, init_from, objectives
from paxlike.trainer.build import Trainer
from paxlike.trainer.checkpoint import Checkpoints
from paxlike.trainer.restore_fallback import Fallback
from paxlike.trainer.preemption import StopSignal
from paxlike.trainer.program import Program
from paxlike.trainer.summaries import RunWriter, status
from paxlike.trainer.train_state import FINITE, TrainState, with_hyperparams


@jax.jit
def _add_metrics(sums: dict, metrics: dict) -> dict:
  return jax.tree.map(jnp.add, sums, metrics)


@jax.jit
def _mean_metrics(sums: dict, count: jax.Array) -> dict:
  return jax.tree.map(lambda x: x / count, sums)


def host_round(trainer: Trainer, step: int) -> tuple[dict, np.ndarray]:
  """This process's block of step `step`'s batches, and the client weights: a pure function of
  (seed, step)."""
  clients, _, rows = trainer.program.block
  return trainer.task.data.round_batches(trainer.task.train.seed, step, clients=clients, rows=rows)


def round_inputs(trainer: Trainer, step: int, host: tuple[dict, np.ndarray] | None = None
                 ) -> tuple[Any, Any, jax.Array]:
  """Step `step`'s sharded batches, client weights and rng (from `host` if already fetched)."""
  batches, weights = host if host is not None else host_round(trainer, step)
  program = trainer.program
  batches = partitioning.block_to_global(
      batches, partitioning.round_batch_sharding(program.mesh), program.block,
      program.round_shape)
  weights = partitioning.host_to_global(np.asarray(weights, np.float32),
                                        partitioning.client_sharding(program.mesh))
  return batches, weights, jax.random.fold_in(jax.random.key(trainer.task.train.seed), step)


def restore_or_init(task: Task, program: Program, checkpoints: Checkpoints,
                    allow_config_change: bool = False) -> tuple[int, TrainState, dict]:
  """The latest committed (step, state, metadata), or (0, a fresh state, {}). A checkpoint saved
  at another data position (seed) is refused unless the user allowed the config to change; then
  the optimizer hyperparameters (learning rates, ...) are the config's, not the checkpoint's.
  A fresh state with `train.init_from` starts from the source's params (`init_from`), with the
  optimizer state the algorithm's init of them; a resumed run never reads the source."""
  restored = checkpoints.restore(program.abstract_state)
  rng = jax.random.key(task.train.seed)
  if restored is not None:
    step, state, meta = restored
    if not allow_config_change:
      checkpoint.check_data_position(meta, task.train.seed, step)
    else:
      with jax.set_mesh(program.mesh):
        state = with_hyperparams(state, program.hyperparams(rng))
    status(f'resumed from checkpoint step {step}')
    return step, state, meta
  source = task.train.init_from
  with jax.set_mesh(program.mesh):
    if source is None:
      return 0, program.init(rng), {}
    imported = init_from.load_params(source, program.abstract_params, task.model,
                                     program.adapters)
    status(f'initialised from {source}: {len(imported)} params '
           f'({init_from.nbytes(imported) / 2**20:.1f} MiB)')
    return 0, program.init_with(imported, rng), {}


def nonfinite_message(step: int, metrics: dict) -> str:
  """What a step that made a non-finite value reports (which value, the loss, the grad norm)."""
  what = ('loss' if not np.isfinite(metrics['loss']) else
          'gradient' if not np.isfinite(metrics.get('grad_norm', 0.0)) else
          'parameters or optimizer state')
  norm = f" grad_norm={float(metrics['grad_norm'])}" if 'grad_norm' in metrics else ''
  return (f"non-finite {what} at step {step}: loss={float(metrics['loss'])}{norm}; "
          'the last checkpoint is untouched')


def _finish(trainer: Trainer, writer: RunWriter, state: TrainState, step: int,
            metrics: dict) -> dict:
  """Host side of step `step` (whose result is `state`): finiteness check, eval and the row
  (returned; {} when the step logs none)."""
  cfg = trainer.task.train
  metrics = jax.device_get(metrics)
  if not metrics.pop(FINITE) and not cfg.skip_nonfinite:  # Raised before this step is saved.
    raise RunFailure(nonfinite_message(step, metrics))
  last = step == cfg.num_steps
  evals, clients = (trainer.evaluator.evaluate_state(state)
                    if step % cfg.eval_every == 0 or last else (None, None))
  if step % cfg.log_every == 0 or evals is not None:
    rate = writer.steps_per_sec(step)
    metrics = {**metrics, 'steps_per_sec': rate, **trainer.reporters.row_metrics(rate, step)}
    return writer.write(step, metrics, evals, clients)
  return {}


def _save(checkpoints: Checkpoints, seed: int, step: int, state: TrainState, sums: dict,
          count: int) -> None:
  """Saves `state` at `step` with the data position and the metric sums since the last row."""
  checkpoints.save(step, state, {'step': step, 'data': checkpoint.data_position(seed, step),
                                 'metric_sums': {k: float(v)
                                                 for k, v in jax.device_get(sums).items()},
                                 'metric_steps': count})


def _run_steps(trainer: Trainer, checkpoints: Checkpoints, writer: RunWriter, start: int,
               state: TrainState, meta: dict) -> dict[str, Any]:
  """Steps `start + 1` to `train.num_steps` (or to a stop signal): the last row written."""
  cfg, program = trainer.task.train, trainer.program
  last_row: dict[str, Any] = {}
  # Device-side sums of the loss and the objective's metrics (logged as the means over the
  # steps since the previous row: a step's own value is noisy), checkpointed (exactly:
  # float32 -> JSON float -> float32) so that a resume between rows logs the uninterrupted means.
  sums = {k: np.float32(v) for k, v in meta.get('metric_sums', {}).items()}
  count = meta.get('metric_steps', 0)
  with (StopSignal() as stop, jax.set_mesh(program.mesh), nn.logical_axis_rules(program.rules),
        Prefetcher(functools.partial(host_round, trainer), start + 1) as host_rounds):
    pending = None  # (step, metrics) dispatched but not yet read back: ≤ 2 steps in flight.
    waited, row_start = 0.0, time.perf_counter()  # Blocked on the data since the last row.
    for step in range(start + 1, cfg.num_steps + 1):
      asked = time.perf_counter()
      host = host_rounds.get(step)
      waited += time.perf_counter() - asked
      state, metrics = trainer.step(state, *round_inputs(trainer, step, host))
      means = objectives.mean_metrics(trainer.objective, metrics)
      sums, count = (_add_metrics(sums, means) if count else means), count + 1
      if step % cfg.log_every == 0 or step % cfg.eval_every == 0 or step == cfg.num_steps:
        now = time.perf_counter()
        metrics = {**metrics, **_mean_metrics(sums, np.float32(count)),
                   'data_wait_time_fraction': waited / max(now - row_start, 1e-9)}
        sums, count, waited, row_start = {}, 0, 0.0, now
      if pending:
        last_row = _finish(trainer, writer, state, *pending) or last_row
      pending = (step, metrics)
      stopping = stop.should_stop(step)
      save_now = step % cfg.checkpoint_every == 0 or step == cfg.num_steps or stopping
      if save_now or step % cfg.eval_every == 0:  # These need this step's state: sync now.
        last_row = _finish(trainer, writer, state, *pending) or last_row
        pending = None
      if save_now:
        _save(checkpoints, cfg.seed, step, state, sums, count)
      if stopping and step < cfg.num_steps:
        status(f'{stop.reason}: saved step {step}, exiting')
        break
    if pending:
      last_row = _finish(trainer, writer, state, *pending) or last_row
  if start >= cfg.num_steps:
    status(f'already trained to step {start}')
  return last_row


def train(trainer: Trainer, job_dir: Path, *, restore_fallback: Fallback = 'off',
          allow_config_change: bool = False,
          on_start: Callable[[], None] | None = None) -> dict[str, Any]:
  """Trains `trainer.task` to `train.num_steps`, resuming from `job_dir` if it holds a checkpoint.

  `on_start` runs on the primary process once the state is restored (or initialised), before
  anything is written. Returns the last metrics row. Raises RunFailure on a non-finite loss
  (nothing of the bad state is saved). SIGTERM/SIGINT save the current step and return early.
  A failure is reported as the first one: a save that fails after it does not replace it.
  """
  task, cfg, program = trainer.task, trainer.task.train, trainer.program
  primary = jax.process_index() == 0
  checkpoints = Checkpoints(job_dir / 'checkpoints', cfg.max_to_keep, fallback=restore_fallback)
  start, state, meta = restore_or_init(task, program, checkpoints, allow_config_change)
  if jax.process_count() > 1:
    clients, _, rows = program.block
    status(f'process {jax.process_index()} loads clients {clients.start}:{clients.stop}, rows '
           f'{rows.start}:{rows.stop} of each {list(program.round_shape)} round batch')
  if on_start and primary:
    on_start()
  if start == 0 and cfg.init_from is not None and primary:
    init_from.write_record(job_dir, init_from.source_record(cfg.init_from))
  writer = RunWriter(job_dir, start, cfg.num_steps, primary=primary)
  if trainer.objective.open_run is not None:  # Its files beside the rows (GRPO's samples).
    trainer.objective.open_run(trainer.step, job_dir, start, primary)
  try:
    last_row = _run_steps(trainer, checkpoints, writer, start, state, meta)
  except BaseException:
    _close(checkpoints, writer, quietly=True)  # The first failure is the one to report.
    raise
  _close(checkpoints, writer)
  return last_row


def _close(checkpoints: Checkpoints, writer: RunWriter, quietly: bool = False) -> None:
  """Waits for the checkpoints in flight (a failed save raises, unless `quietly`), then closes
  the checkpoints and the writer."""
  try:
    checkpoints.wait()
  except Exception:  # pylint: disable=broad-except
    if not quietly:
      raise
  finally:
    checkpoints.close()
    writer.close()
