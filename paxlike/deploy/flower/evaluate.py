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

  def __init__(self, task: Any, at_clients: list[str] | tuple[str, ...] = ()):
    """`at_clients`: the state the nodes keep (client_state.py), which the server lacks: the
    evaluator is given zeros for it, and its first call checks that ones give the same
    metrics (else it reads that state, and is refused in one line)."""
    self.task, self.trainer, self.at_clients, self.checked = task, None, set(at_clients), False

  def __call__(self, carried: dict[str, np.ndarray]
               ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(pooled eval metrics, the per-client table) of the state `carried`."""
    from paxlike.trainer import build
    if self.trainer is None:
      self.trainer = build.setup(self.task, train_step=False)
    result = self._evaluate(carried, 0)
    if self.at_clients and not self.checked:
      if self._evaluate(carried, 1)[0] != result[0]:
        raise ValueError('the evaluator reads the state the nodes keep '
                         f'({sorted(self.at_clients)[0]}, ...), which the server lacks')
      self.checked = True
    return result

  def _evaluate(self, carried: dict[str, np.ndarray], fill: int) -> Any:
    import jax
    from paxlike.export import trees
    abstract = self.trainer.program.abstract_state.alg
    names = trees.leaf_names('state', abstract)
    missing = [n for n in names if n not in carried and n not in self.at_clients]
    if missing:
      raise ValueError(f'the server state lacks {missing[0]}, which the evaluator reads')
    leaves = [jax.device_put(np.asarray(carried[n]) if n in carried
                             else np.full(a.shape, fill, a.dtype), a.sharding)
              for n, a in zip(names, jax.tree.leaves(abstract))]
    with jax.set_mesh(self.trainer.program.mesh):
      return self.trainer.evaluator.evaluate(jax.tree.unflatten(jax.tree.structure(abstract),
                                                                leaves))
