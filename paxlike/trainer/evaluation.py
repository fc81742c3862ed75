"""Held-out evaluation: pooled metrics (clu), per-client metrics, and an algorithm's ensemble.

One pass over the data source's eval batches gives everything: the pooled loss and accuracy,
and per-group sums that `ClientEval` turns into each client's held-out metrics. Algorithms that
keep an ensemble (BTM's experts) are evaluated both ways: as the merged params (`loss`) and as
the ensemble (`ensemble_loss`). With `train.personalize_steps` = k set, each client also
fine-tunes the global model k local steps on its own data and is scored on its own held-out
split (`personalized_*`, see `personalization`). These are the pure parts; `evaluator.py`
compiles them for a mesh and runs them over the eval batches.
"""


import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from clu import metrics as clu_metrics

from paxlike.trainer import losses
from paxlike.data.sources import ClientEval, Item
from paxlike.errors import UserError
from paxlike.families import family_of

# An algorithm's ensemble: state -> (stacked member params, log prior [members]).
Ensemble = Callable[[Any], tuple[Any, jax.Array]]
Outputs = dict[str, tuple['EvalMetrics', jax.Array]]  # Prefix ('' or 'ensemble_') -> results.


def named_average(output: str, name: str, module: str) -> type:
  """clu's `Average.from_output(output)` (a class clu makes anew inside each call) named
  `module.name`, where the caller binds it, so that pickle finds it: the output tree of an eval
  program kept compiled names it (core.program_store)."""
  average = clu_metrics.Average.from_output(output)
  average.__module__, average.__name__, average.__qualname__ = module, name, name
  return average


EvalLoss = named_average('loss', 'EvalLoss', __name__)
EvalAccuracy = named_average('accuracy', 'EvalAccuracy', __name__)


@clu_metrics.flax.struct.dataclass
class EvalMetrics(clu_metrics.Collection):
  loss: EvalLoss
  accuracy: EvalAccuracy


def group_sums(values: jax.Array, correct: jax.Array, mask: jax.Array, groups: jax.Array,
               num_groups: int) -> jax.Array:
  """float32 [3, num_groups]: masked loss sums, correct counts and target counts per group
  (group -1 is dropped)."""
  ids = jnp.where(groups < 0, num_groups, groups).ravel()
  stacked = jnp.stack([values * mask, correct * mask, mask]).reshape(3, -1)
  return jax.vmap(lambda v: jax.ops.segment_sum(v, ids, num_groups + 1))(stacked)[:, :num_groups]


def eval_step(model: nn.Module, item: Item, num_groups: int, ensemble: Ensemble | None = None
              ) -> Callable[[Any, dict, jax.Array], Outputs]:
  """`step(alg_state, batch, groups)`: metrics of `alg_state.params` (and of the ensemble, mixed
  as the model's family mixes one) on batches of `item`s, the items the family trains on."""
  family = family_of(model)
  if item != family.item:
    raise UserError(f'{type(model).__name__} is evaluated on {family.item}, not {item}')

  def results(logits, batch, groups):
    per_target, correct = losses.per_example_loss(logits, batch)
    mask = batch['mask'].astype(jnp.float32)
    metrics = EvalMetrics.single_from_model_output(loss=per_target, accuracy=correct,
                                                   mask=mask.astype(bool))
    return metrics, group_sums(per_target, correct, mask, groups, num_groups)

  def step(state, batch, groups):
    extra = losses.model_inputs(batch)  # Packed batches: documents kept apart, as in training.

    def apply(params, inputs):
      return model.apply({'params': params}, inputs, deterministic=True, **extra)

    out = {'': results(apply(state.params, batch['inputs']), batch, groups)}
    if ensemble is not None:  # LMs: mixed by the domain posterior; classifiers: by the prior.
      members, log_prior = ensemble(state)
      mixed = family.mix_ensemble(apply, members, batch['inputs'], log_prior)
      out['ensemble_'] = results(mixed, batch, groups)
    return out

  return step


def client_scores(sums: np.ndarray, mix: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(loss, accuracy, covered, targets), each [clients], from `group_sums` totals: [3, groups]
  for one model, or [clients, 3, groups] for one model per client (client c scored by its
  own). A client is covered when every group in its mix has eval targets."""
  loss_sum, correct_sum, count = np.moveaxis(np.asarray(sums, np.float64), -2, 0)
  seen = count > 0
  group_loss = np.where(seen, loss_sum, 0.0) / np.maximum(count, 1.0)
  group_accuracy = np.where(seen, correct_sum, 0.0) / np.maximum(count, 1.0)
  covered = ~((mix > 0) & ~seen).any(axis=-1)
  targets = ((mix > 0) * count).sum(axis=-1)  # Eval targets behind each client's numbers.
  return (mix * group_loss).sum(axis=-1), (mix * group_accuracy).sum(axis=-1), covered, targets


def client_summary(loss: np.ndarray, accuracy: np.ndarray, covered: np.ndarray,
                   name: str = 'client') -> dict[str, float]:
  """Mean and tail over the covered clients: `{name}_loss_mean`, the 90th-percentile loss
  `{name}_loss_p90`, `{name}_accuracy_mean` and the 10th-percentile accuracy
  `{name}_accuracy_p10` (the worst-off clients); empty when no client is covered."""
  if not covered.any():
    return {}
  return {f'{name}_loss_mean': float(loss[covered].mean()),
          f'{name}_loss_p90': float(np.percentile(loss[covered], 90)),
          f'{name}_accuracy_mean': float(accuracy[covered].mean()),
          f'{name}_accuracy_p10': float(np.percentile(accuracy[covered], 10))}


def client_metrics(sums: np.ndarray, client_eval: ClientEval
                   ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
  """(summary, table) of per-client held-out metrics from `group_sums` totals.

  The table gives each covered client's numbers and their `targets` (few targets, noisy
  numbers); the summary the number evaluated and `client_summary` over them."""
  loss, accuracy, covered, targets = client_scores(sums, client_eval.mix)
  table = {name: {'loss': float(loss[c]), 'accuracy': float(accuracy[c]),
                  'targets': int(targets[c])}
           for c, name in enumerate(client_eval.names) if covered[c]}
  summary = {'clients_evaluated': int(covered.sum()), **client_summary(loss, accuracy, covered)}
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


# Personalization: every client with held-out data fine-tunes the global model for k local
# steps on its own training data (the task's client optimizer, fresh state) and is scored on its
# own held-out split; with k = 0 this is the per-client eval above, one model per client.

PERSONALIZE_STEP = -1  # The (seed, step) whose round batches are the fine-tuning data: no
                       # training round uses a negative step.


# tune(params, batches [clients, k, ...], rng) -> client-placed params after each client's k
# local steps from `params` (federated.clients.fine_tuned, passed in by the evaluator).
Tune = Callable[[Any, Any, jax.Array], Any]


def personalized_sums(model: nn.Module, tune: Tune, num_groups: int
                      ) -> tuple[Tune, Callable[[Any, dict, jax.Array], jax.Array]]:
  """(tune, score): `tune` compiled, and `score(tuned, batch, groups)` → float32 [clients, 3,
  num_groups] `group_sums` of each client's model on one eval batch."""

  @jax.jit
  def score(tuned, batch, groups):
    def one(params):
      logits = model.apply({'params': params}, batch['inputs'], deterministic=True,
                           **losses.model_inputs(batch))
      per_target, correct = losses.per_example_loss(logits, batch)
      return group_sums(per_target, correct, batch['mask'].astype(jnp.float32), groups,
                        num_groups)
    return jax.lax.map(one, tuned, batch_size=8)

  return jax.jit(tune), score


def personalization(task: Any, client_eval: ClientEval | None, tune: Tune
                    ) -> Callable[[Any], dict[str, float]] | None:
  """`metrics(params)`: `personalized_{loss,accuracy}_{mean,p90,p10}` (as `client_summary`)
  after `task.train.personalize_steps` local steps per client (`tune`, with the task's
  optimizer); None when that is None or the clients have no held-out data."""
  steps = task.train.personalize_steps
  if steps is None or client_eval is None:
    return None
  clients = len(client_eval.names)
  tune, score = personalized_sums(task.model, tune, client_eval.num_groups)

  @functools.cache
  def own_batches():  # Every client's k batches, client c in slot c ('fixed' cohort).
    data = dataclasses.replace(task.data, sampling='fixed', clients_per_round=clients,
                               local_steps=steps)
    return data.round_batches(task.train.seed, PERSONALIZE_STEP)[0]

  def metrics(params):
    if steps == 0:
      tuned = jax.tree.map(lambda p: jnp.broadcast_to(p, (clients, *p.shape)), params)
    else:
      tuned = tune(params, own_batches(), jax.random.key(task.train.seed))
    sums = sum(score(tuned, batch, group)
               for batch, group in zip(task.data.eval_batches(), client_eval.groups))
    loss, accuracy, covered, _ = client_scores(jax.device_get(sums), client_eval.mix)
    return client_summary(loss, accuracy, covered, 'personalized')

  return metrics
