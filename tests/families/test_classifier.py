"""The classifier family's answers, each against an independent computation."""

import types

import fiddle as fdl
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.trainer import losses
from paxlike.errors import UserError
from paxlike.families import classifier, family_of
from paxlike.layers import CnnClassifier, MlpClassifier

MODEL = MlpClassifier(num_classes=5, hidden=(8,))
FAMILY = classifier.FAMILY
DATA = types.SimpleNamespace(item='examples', image_shape=(4, 4, 1), client_sizes=np.ones(7))


def test_the_vision_classifiers_are_in_the_classifier_family():
  for model in (MODEL, CnnClassifier(), fdl.Config(CnnClassifier), MlpClassifier):
    assert family_of(model) is FAMILY
  assert FAMILY.name == 'classifier' and FAMILY.item == 'examples' and not FAMILY.can_decode
  assert FAMILY.kernel_line(MODEL, DATA) == '' and FAMILY.memory_summary(None) == ''


def test_summary_counts_params_by_hand():
  """A 16 → 8 → 5 MLP: 16·8 + 8 weights and biases, then 8·5 + 5."""
  lines = FAMILY.summary(MODEL, DATA).splitlines()
  assert lines[0] == f'# params: {16 * 8 + 8 + 8 * 5 + 5:,}'
  assert lines[1].startswith('# train FLOPs per example: ')


def _batches(clients, steps, batch=6):
  shape = (clients, steps, batch)
  return {'inputs': np.ones((*shape, 4, 4, 1), np.float32), 'targets': np.zeros(shape, np.int32),
          'mask': np.ones(shape, np.float32)}


_INIT = jax.jit(MODEL.init)  # One program: eagerly, every op of the init compiles on its own.


def test_step_flops_are_one_gradients_count_times_clients_and_local_steps_per_device():
  boxed = _INIT(jax.random.key(0), jnp.zeros((1, 4, 4, 1)))['params']
  loss_fn = losses.model_loss_fn(MODEL)
  one = FAMILY.step_flops(MODEL, loss_fn, boxed, _batches(1, 1), 1)
  # At least the forward and weight-gradient matmuls of 6 examples: 2 × 2·6·(16·8 + 8·5).
  assert one >= 2 * 2 * 6 * (16 * 8 + 8 * 5)
  assert FAMILY.step_flops(MODEL, loss_fn, boxed, _batches(3, 2), 4) == one * 3 * 2 / 4
  assert FAMILY.items_per_step(_batches(3, 2)) == 3 * 2 * 6


def test_the_ensemble_is_the_prior_weighted_mixture():
  params = nn.unbox(_INIT(jax.random.key(0), jnp.zeros((1, 4, 4, 1))))['params']
  experts = jax.tree.map(lambda p: np.stack([p, np.asarray(p) * np.float32(-1.5)]), params)
  inputs = jax.random.normal(jax.random.key(1), (3, 4, 4, 1))
  prior = np.array([0.4, 0.6])

  def apply(p, x):
    return MODEL.apply({'params': p}, x)

  # Jitted: eagerly, every op compiles on its own.
  softmax = jax.jit(lambda p: jax.nn.softmax(apply(p, inputs)))
  probs = [np.asarray(softmax(jax.tree.map(lambda x: x[k], experts))) for k in (0, 1)]
  mixed = jax.jit(FAMILY.mix_ensemble, static_argnums=0)(apply, experts, inputs, jnp.log(prior))
  np.testing.assert_allclose(np.exp(mixed), prior[0] * probs[0] + prior[1] * probs[1],
                             rtol=1e-5, atol=1e-7)


def test_the_family_does_not_count_clients_and_shrink_leaves_the_config():
  assert not hasattr(FAMILY, 'population')  # The data source counts them: client_sizes.
  cfg = fdl.Config(CnnClassifier, dense=64)
  FAMILY.shrink(cfg)
  assert cfg == fdl.Config(CnnClassifier, dense=64)


def test_a_classifier_on_token_data_is_a_user_error():
  with pytest.raises(UserError) as error:
    FAMILY.check_data(MODEL, types.SimpleNamespace(item='tokens'))
  assert str(error.value) == ('model MlpClassifier trains on examples but the data '
                              'SimpleNamespace gives tokens: pair an LM with token data and a '
                              'classifier with example data')
  FAMILY.check_data(MODEL, DATA)
