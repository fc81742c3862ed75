"""The held-out evaluator of a placed task: its own compiled eval step, the rows of each eval
batch this process loads, the per-client split and personalization (`evaluation.py` holds the
pure parts)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh

from paxlike.core import partitioning
from paxlike.core.trainable import TrainableMask
from paxlike.data.sources import ClientEval
from paxlike.federated.clients import fine_tuned
from paxlike.trainer import evaluation, losses, objectives
from paxlike.trainer.program import Kept, Program, compiled, placed_spec
from paxlike.trainer.task import Task
from paxlike.trainer.train_state import TrainState, ema_params

Table = dict[str, dict[str, float]]  # Client name -> its held-out metrics.


@dataclasses.dataclass(frozen=True)
class Evaluator:
  """Evaluates an algorithm state on the task's held-out data (see `evaluate`)."""

  data: Any                       # The task's data source (its eval batches).
  mesh: Mesh
  step: Callable[[Any, dict, jax.Array], evaluation.Outputs]  # Compiled (alg state, batch, groups).
  client_eval: ClientEval | None  # How eval splits into clients' held-out metrics.
  batch_size: int
  rows: slice                     # The rows of each eval batch this process loads.
  personalized: Callable[[Any], dict[str, float]] | None = None  # Eval after fine-tuning.
  held_out: Callable[[Any], dict[str, float]] | None = None  # The objective's (GRPO: reward).
  trainable: TrainableMask | None = None

  def evaluate(self, alg_state: Any) -> tuple[dict[str, float], Table]:
    """Held-out metrics of `alg_state.params` (and of the algorithm's ensemble): pooled loss and
    accuracy plus per-client summaries, and the per-client table (`evaluation.finish`)."""
    batches = self.data.eval_batches(rows=self.rows)
    groups = ([g[self.rows] for g in self.client_eval.groups] if self.client_eval else
              [np.zeros(b['mask'].shape, np.int32) for b in batches])
    sharding, totals = partitioning.eval_batch_sharding(self.mesh), None
    for batch, group in zip(batches, groups):
      batch, group = partitioning.block_to_global((batch, group), sharding, (self.rows,),
                                                  (self.batch_size,))
      totals = evaluation.combine(totals, self.step(alg_state, batch, group))
    metrics, table = evaluation.finish(totals, self.client_eval)
    if self.personalized is not None:
      metrics.update(self.personalized(alg_state.params))
    if self.held_out is not None:
      metrics.update(self.held_out(alg_state.params))
    return metrics, table

  def evaluate_state(self, state: TrainState) -> tuple[dict[str, float], Table]:
    """`evaluate` of the params and, with an EMA, its pooled metrics as `ema_*` (the same
    compiled eval on the EMA params; no per-client table, personalization or the objective's
    own held-out metrics)."""
    evals, clients = self.evaluate(state.alg)
    ema = ema_params(state, self.trainable)
    if ema is not None:
      ema_evals, _ = dataclasses.replace(self, personalized=None, held_out=None).evaluate(
          state.alg._replace(params=ema))
      evals.update({f'ema_{k}': v for k, v in ema_evals.items() if k != 'clients_evaluated'})
    return evals, clients


def build_evaluator(task: Task, program: Program, kept: Kept | None = None) -> Evaluator:
  """The evaluator of `task` placed as `program`: its objective's eval step compiled for the
  mesh (kept where `kept` says) and held-out metrics."""
  data, mesh, objective = task.data, program.mesh, objectives.of_task(task)
  client_eval = data.client_eval()
  eval_batch = program.eval_batch_spec  # Read once, by `place`.
  sharding = partitioning.eval_batch_sharding(mesh)
  step = objective.eval_step(task, program, client_eval.num_groups if client_eval else 1)
  with jax.set_mesh(mesh), nn.logical_axis_rules(program.rules):
    step = compiled(jax.jit(step), (
        program.abstract_state.alg, jax.tree.map(lambda x: placed_spec(x, sharding), eval_batch),
        jax.ShapeDtypeStruct(eval_batch['mask'].shape, np.int32, sharding=sharding)), mesh, kept,
                    'eval_step')
  batch_size = eval_batch['inputs'].shape[0]
  return Evaluator(data=data, mesh=mesh, step=step, client_eval=client_eval,
                   batch_size=batch_size,
                   rows=partitioning.process_block(sharding, (batch_size,))[0],
                   personalized=evaluation.personalization(task, client_eval, fine_tuned(
                       losses.model_loss_fn(task.model), task.optimizer)),
                   held_out=(objective.held_out(task, program) if objective.held_out
                             else None),
                   trainable=program.trainable)
