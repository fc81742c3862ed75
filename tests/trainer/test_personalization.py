"""Personalization eval: k = 0 is the per-client eval; k = 1 matches fine-tuning by hand."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from paxlike.trainer import evaluation, losses
from paxlike.data import ImageData
from paxlike.errors import UserError
from paxlike.federated.clients import fine_tuned
from paxlike.trainer.task import Task, TrainConfig
from paxlike.layers.vision import MlpClassifier

MODEL = MlpClassifier(num_classes=10, hidden=(8,))


class State(NamedTuple):
  params: Any


def _task(steps: int | None, learning_rate: float = 0.5) -> Task:
  data = ImageData(dataset='digits', partition='dirichlet', alpha=0.3, num_clients=6,
                   clients_per_round=2, batch_size=4, eval_batch_size=128, num_eval_batches=3)
  return Task(model=MODEL, optimizer=optax.sgd(learning_rate), algorithm=None, data=data,
              train=TrainConfig(personalize_steps=steps, seed=3))


def _params():  # Jitted here and below: eagerly, every op compiles on its own.
  return jax.jit(MODEL.init)(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))['params']


def _personalization(task, client_eval):
  """The evaluator's personalization: clients fine-tuned by federated.clients.fine_tuned."""
  return evaluation.personalization(
      task, client_eval, fine_tuned(losses.model_loss_fn(task.model), task.optimizer))


def _client_eval_summary(task, params):
  client_eval = task.data.client_eval()
  step, totals = jax.jit(evaluation.eval_step(MODEL, task.data.item, client_eval.num_groups)), None
  for batch, groups in zip(task.data.eval_batches(), client_eval.groups):
    totals = evaluation.combine(totals, step(State(params), batch, groups))
  return evaluation.finish(totals, client_eval)[0]


def test_zero_steps_is_the_per_client_eval():
  task, params = _task(0), _params()
  personalized = _personalization(task, task.data.client_eval())(params)
  summary = _client_eval_summary(task, params)
  assert set(personalized) == {'personalized_loss_mean', 'personalized_loss_p90',
                               'personalized_accuracy_mean', 'personalized_accuracy_p10'}
  for key, value in personalized.items():
    assert value == pytest.approx(summary[key.replace('personalized', 'client')], rel=1e-6)


def test_one_step_is_each_client_fine_tuned_and_scored_on_its_own_mix():
  lr, task, params = 0.5, _task(1, 0.5), _params()
  personalized = _personalization(task, task.data.client_eval())(params)
  data, client_eval = task.data, task.data.client_eval()
  eval_batches = data.eval_batches()
  test_images = np.concatenate([b['inputs'] for b in eval_batches])
  test_labels = np.concatenate([b['targets'] for b in eval_batches])
  real = np.concatenate([b['mask'] for b in eval_batches]) > 0
  loss_fn = losses.model_loss_fn(MODEL)
  own = ImageData(dataset='digits', partition='dirichlet', alpha=0.3, num_clients=6,
                  clients_per_round=6, sampling='fixed', batch_size=4)
  batches, _ = own.round_batches(task.train.seed, evaluation.PERSONALIZE_STEP)
  client_losses, client_accuracies = [], []

  @jax.jit
  def tuned_logits(params, batch, images):
    grads = jax.grad(lambda p: loss_fn(p, batch, None)[0])(params)
    tuned = jax.tree.map(lambda p, g: p - lr * g, params, grads)
    return MODEL.apply({'params': tuned}, images)

  for c in range(6):
    logits = np.asarray(tuned_logits(params, jax.tree.map(lambda x: x[c, 0], batches),
                                     test_images), np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -log_probs[np.arange(len(test_labels)), test_labels]
    hit = logits.argmax(-1) == test_labels
    # Client c's score: the test set reweighted to its training label mix.
    per_class = [(nll[real & (test_labels == k)].mean(), hit[real & (test_labels == k)].mean())
                 for k in range(10)]
    client_losses.append(client_eval.mix[c] @ np.array([p[0] for p in per_class]))
    client_accuracies.append(client_eval.mix[c] @ np.array([p[1] for p in per_class]))
  assert personalized['personalized_loss_mean'] == pytest.approx(np.mean(client_losses), rel=1e-4)
  assert personalized['personalized_loss_p90'] == pytest.approx(
      np.percentile(client_losses, 90), rel=1e-4)
  assert personalized['personalized_accuracy_mean'] == pytest.approx(
      np.mean(client_accuracies), rel=1e-4)
  # One step on its own labels helps each client on its own mix.
  assert personalized['personalized_loss_mean'] < _client_eval_summary(task, params)[
      'client_loss_mean']


def test_off_without_steps_or_held_out_data_and_bad_steps_refused():
  assert _personalization(_task(None), _task(None).data.client_eval()) is None
  assert _personalization(_task(2), None) is None
  with pytest.raises(UserError, match='personalize_steps'):
    TrainConfig(personalize_steps=-1)
