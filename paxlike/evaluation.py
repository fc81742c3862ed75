"""Held-out evaluation: pooled metrics (clu), per-client metrics, and an algorithm's ensemble.

One pass over the data source's eval batches gives everything: the pooled loss and accuracy,
and per-group sums that `ClientEval` turns into each client's held-out metrics. Algorithms that
keep an ensemble (BTM's experts) are evaluated both ways: as the merged params (`loss`) and as
the ensemble (`ensemble_loss`).
"""


from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from clu import metrics as clu_metrics

from paxlike import losses
from paxlike.data.sources import ClientEval
from paxlike.federated.btm import ensemble_log_probs, mixture_log_probs

# An algorithm's ensemble: state -> (stacked member params, log prior [members]).
Ensemble = Callable[[Any], tuple[Any, jax.Array]]
Outputs = dict[str, tuple['EvalMetrics', jax.Array]]  # Prefix ('' or 'ensemble_') -> results.


@clu_metrics.flax.struct.dataclass
class EvalMetrics(clu_metrics.Collection):
  loss: clu_metrics.Average.from_output('loss')
  accuracy: clu_metrics.Average.from_output('accuracy')


def group_sums(values: jax.Array, correct: jax.Array, mask: jax.Array, groups: jax.Array,
               num_groups: int) -> jax.Array:
  """float32 [3, num_groups]: masked loss sums, correct counts and target counts per group
  (group -1 is dropped)."""
  ids = jnp.where(groups < 0, num_groups, groups).ravel()
  stacked = jnp.stack([values * mask, correct * mask, mask]).reshape(3, -1)
  return jax.vmap(lambda v: jax.ops.segment_sum(v, ids, num_groups + 1))(stacked)[:, :num_groups]


def eval_step(model: nn.Module, num_groups: int, ensemble: Ensemble | None = None
              ) -> Callable[[Any, dict, jax.Array], Outputs]:
  """`step(alg_state, batch, groups)`: metrics of `alg_state.params` (and of the ensemble)."""

  def results(logits, batch, groups):
    per_target, correct = losses.per_example_loss(logits, batch)
    mask = batch['mask'].astype(jnp.float32)
    metrics = EvalMetrics.single_from_model_output(loss=per_target, accuracy=correct,
                                                   mask=mask.astype(bool))
    return metrics, group_sums(per_target, correct, mask, groups, num_groups)

  def apply(params, inputs):
    return model.apply({'params': params}, inputs, deterministic=True)

  def step(state, batch, groups):
    out = {'': results(apply(state.params, batch['inputs']), batch, groups)}
    if ensemble is not None:  # LMs: mixed by the domain posterior; classifiers: by the prior.
      members, log_prior = ensemble(state)
      mix = (ensemble_log_probs if jnp.issubdtype(batch['inputs'].dtype, jnp.integer)
             else mixture_log_probs)
      out['ensemble_'] = results(mix(apply, members, batch['inputs'], log_prior), batch, groups)
    return out

  return step


def client_metrics(sums: np.ndarray, client_eval: ClientEval
                   ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
  """(summary, table) of per-client held-out metrics from `group_sums` totals.

  A client is evaluated when every group in its mix has eval targets; the table gives their
  number (`targets`: few targets, noisy numbers). The summary gives the
  number evaluated and the mean and tail over them: the 90th-percentile loss and the
  10th-percentile accuracy (the worst-off clients)."""
  loss_sum, correct_sum, count = np.asarray(sums, np.float64)
  seen = count > 0
  group_loss = np.where(seen, loss_sum, 0.0) / np.maximum(count, 1.0)
  group_accuracy = np.where(seen, correct_sum, 0.0) / np.maximum(count, 1.0)
  covered = ~((client_eval.mix > 0) & ~seen).any(axis=1)
  loss, accuracy = client_eval.mix @ group_loss, client_eval.mix @ group_accuracy
  targets = (client_eval.mix > 0) @ count  # Eval targets behind each client's numbers.
  table = {name: {'loss': float(loss[c]), 'accuracy': float(accuracy[c]),
                  'targets': int(targets[c])}
           for c, name in enumerate(client_eval.names) if covered[c]}
  summary: dict[str, float] = {'clients_evaluated': int(covered.sum())}
  if covered.any():
    summary.update(client_loss_mean=float(loss[covered].mean()),
                   client_loss_p90=float(np.percentile(loss[covered], 90)),
                   client_accuracy_mean=float(accuracy[covered].mean()),
                   client_accuracy_p10=float(np.percentile(accuracy[covered], 10)))
  return summary, table


def combine(totals: Outputs | None, update: Outputs) -> Outputs:
  """Running totals over eval batches."""
  if totals is None:
    return update
  return {k: (totals[k][0].merge(m), totals[k][1] + sums) for k, (m, sums) in update.items()}


def finish(totals: Outputs, client_eval: ClientEval | None
           ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
  """(metrics, per-client table) from the totals: pooled `loss`, `accuracy`, the per-client
  summary, and the same with `ensemble_` in front for an ensemble."""
  metrics: dict[str, float] = {}
  table: dict[str, dict[str, float]] = {}
  for prefix, (pooled, sums) in totals.items():
    metrics.update({prefix + k: float(v) for k, v in pooled.compute().items()})
    if client_eval is not None:
      summary, clients = client_metrics(jax.device_get(sums), client_eval)
      metrics.update({prefix + k: v for k, v in summary.items()
                      if not (prefix and k == 'clients_evaluated')})
      for name, row in clients.items():
        table.setdefault(name, {}).update({prefix + k: v for k, v in row.items()
                                           if not (prefix and k == 'targets')})
  return metrics, table
