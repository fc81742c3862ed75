"""The simulation's held-out evaluation in a deployed run: where the ServerApp runs, paxlike's
own evaluator (the trainer's compiled eval step on the experiment's pooled eval data) scores
the server's state at the steps the trainer evaluates (every `train.eval_every` rounds and the
config's last step), so the deployed rows carry the trainer's `eval_*` fields.

The export's programs are the round only; evaluating is not part of the algorithm, so it runs
the trainer's code on the saved config rather than a program of the export. It needs the eval
data on the server's host (the held-out split the simulation pools; no client's training data).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def due(task: Any, step: int) -> bool:
  """Whether the trainer evaluates after `step` (every eval_every steps, and at its last)."""
  return step % task.train.eval_every == 0 or step == task.train.num_steps


class ServerEval:
  """Evaluates named server state (`state.*` arrays, as the export carries it) with the task's
  evaluator, compiled once on first use."""

  def __init__(self, task: Any):
    self.task, self.trainer = task, None

  def __call__(self, carried: dict[str, np.ndarray]
               ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(pooled eval metrics, the per-client table) of the state `carried`."""
    import jax
    from paxlike.export import trees
    from paxlike.trainer import build
    if self.trainer is None:
      self.trainer = build.setup(self.task, train_step=False)
    abstract = self.trainer.program.abstract_state.alg
    names = trees.leaf_names('state', abstract)
    missing = [n for n in names if n not in carried]
    if missing:
      raise ValueError(f'the server state lacks {missing[0]}, which the evaluator reads')
    leaves = [jax.device_put(np.asarray(carried[n]), a.sharding)
              for n, a in zip(names, jax.tree.leaves(abstract))]
    with jax.set_mesh(self.trainer.program.mesh):
      return self.trainer.evaluator.evaluate(jax.tree.unflatten(jax.tree.structure(abstract),
                                                                leaves))
