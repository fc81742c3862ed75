"""Behaviour of the image classifiers: shapes, parameter counts, names, dropout, training."""

import functools
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from paxlike.layers import CnnClassifier, MlpClassifier
from tests.helpers import run_script

LOGICAL_NAMES = {'embed', 'mlp', None}


def _images(shape, seed: int = 0) -> np.ndarray:
  """Uniform [0, 1) float32 images drawn by numpy (jax.random compiles a program per shape)."""
  return np.random.default_rng(seed).random(shape, np.float32)


def _count(variables) -> int:
  return sum(x.size for x in jax.tree.leaves(nn.unbox(variables)))


@pytest.mark.parametrize('shape', [(3, 28, 28), (3, 28, 28, 1), (3, 8, 8, 3)])
@pytest.mark.parametrize('hidden', [(), (128,), (64, 32)])
def test_mlp_shapes_and_param_count(shape, hidden):
  model = MlpClassifier(num_classes=7, hidden=hidden)
  images = _images(shape)
  # Shapes, dtypes and counts are the abstract values' (nothing computed, nothing compiled).
  variables = jax.eval_shape(model.init, jax.random.key(0), images)
  logits = jax.eval_shape(functools.partial(model.apply, deterministic=True), variables, images)
  assert logits.shape == (3, 7) and logits.dtype == jnp.float32
  widths = [int(np.prod(shape[1:])), *hidden, 7]
  assert _count(variables) == sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))


def test_cnn_matches_fedavg_paper_size():
  images = _images((2, 28, 28, 1))
  variables = jax.eval_shape(CnnClassifier().init, jax.random.key(0), images)  # As above.
  logits = jax.eval_shape(CnnClassifier().apply, variables, images)
  assert logits.shape == (2, 10) and logits.dtype == jnp.float32
  # McMahan et al. 2017: 5x5x32 conv, 5x5x64 conv, 3136->512 dense, 512->10.
  assert _count(variables) == 1_663_370


@pytest.mark.parametrize('shape', [(2, 28, 28), (2, 28, 28, 3), (2, 16, 16, 1)])
def test_cnn_scaled_shapes_and_param_count(shape):
  model = CnnClassifier(num_classes=5, features=(4, 8), dense=16)
  images = _images(shape)
  variables = jax.eval_shape(model.init, jax.random.key(0), images)  # As above.
  assert jax.eval_shape(model.apply, variables, images).shape == (2, 5)
  channels = shape[3] if len(shape) == 4 else 1
  flat = (shape[1] // 4) * (shape[2] // 4) * 8
  expected = (25 * channels * 4 + 4) + (25 * 4 * 8 + 8) + (flat * 16 + 16) + (16 * 5 + 5)
  assert _count(variables) == expected


@pytest.mark.parametrize('model', [MlpClassifier(hidden=(32, 16)), CnnClassifier(features=(4, 8))])
def test_every_param_has_logical_names(model):
  variables = jax.eval_shape(model.init, jax.random.key(0), _images((2, 28, 28, 1)))  # Names.
  boxes = jax.tree.leaves(variables, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  assert boxes and all(isinstance(b, nn.LogicallyPartitioned) for b in boxes)
  for box in boxes:
    assert len(box.names) == box.value.ndim and set(box.names) <= LOGICAL_NAMES
  rules = [('batch', 'data'), ('mlp', 'model'), ('vocab', 'model'), ('embed', None)]
  mesh_specs = jax.tree.leaves(nn.logical_to_mesh(nn.get_partition_spec(variables), rules),
                               is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  for spec in mesh_specs:  # one rule table never puts a mesh axis on two dims
    axes = [a for a in spec if a is not None]
    assert len(axes) == len(set(axes))
  head = nn.get_partition_spec(variables)['params']['head']
  assert head['kernel'][-1] is None and tuple(head['bias']) == (None,)  # classes replicated


# The training test's models (and image shape for init), but with dropout: their ops compile once.
@pytest.mark.parametrize('model', [MlpClassifier(hidden=(32,), dropout_rate=0.5),
                                   CnnClassifier(features=(4, 8), dense=32, dropout_rate=0.5)])
def test_dropout_only_when_not_deterministic(model):
  images = _images((4, 28, 28, 1))
  variables = model.init(jax.random.key(0), images)
  det = model.apply(variables, images, deterministic=True)
  np.testing.assert_allclose(det, model.apply(variables, images), atol=0)
  noisy = model.apply(variables, images, deterministic=False, rngs={'dropout': jax.random.key(1)})
  assert not np.allclose(noisy, det, atol=1e-4)


@pytest.mark.parametrize('model', [MlpClassifier(hidden=(32,)), CnnClassifier(features=(4, 8),
                                                                              dense=32)])
def test_training_reduces_loss(model):
  images = _images((16, 28, 28, 1), seed=1)
  labels = np.random.default_rng(2).integers(0, 10, (16,)).astype(np.int32)
  # Initialised on 4 of the images, as the dropout test does (the params do not depend on it).
  params = nn.unbox(model.init(jax.random.key(0), images[:4]))['params']
  opt = optax.adam(3e-3)

  def loss_fn(p):
    logits = model.apply({'params': p}, images)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

  @jax.jit
  def step(p, state):
    loss, grads = jax.value_and_grad(loss_fn)(p)
    updates, state = opt.update(grads, state, p)
    return optax.apply_updates(p, updates), state, loss

  state = opt.init(params)
  losses = []
  for _ in range(30):
    params, state, loss = step(params, state)
    losses.append(float(loss))
  assert losses[-1] < 0.5 * losses[0]


SHARDED_SCRIPT = textwrap.dedent("""
    import flax.linen as nn, jax, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    from paxlike.layers import CnnClassifier, MlpClassifier
    mesh = jax.make_mesh((2, 4), ('data', 'model'), axis_types=(AxisType.Auto,) * 2)
    rules = [('batch', 'data'), ('vocab', 'model'), ('mlp', 'model'), ('embed', None)]
    images = jax.random.uniform(jax.random.key(1), (8, 28, 28, 1))
    models = (MlpClassifier(hidden=()), MlpClassifier(hidden=(32, 16)),
              CnnClassifier(features=(4, 8), dense=32))
    for model in models:
      boxed = jax.jit(model.init)(jax.random.key(0), images)
      ref = jax.jit(model.apply)(nn.unbox(boxed), images)
      shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules)
      with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        init = jax.jit(lambda k, x: nn.unbox(model.init(k, x)), out_shardings=shardings)
        x = jax.device_put(images, NamedSharding(mesh, P('data')))
        params = init(jax.random.key(0), x)
        out = jax.jit(model.apply)(params, x)
      np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5, rtol=1e-5)
    print('SHARDED_OK')
""")


def test_sharded_apply_matches_single_device():
  assert 'SHARDED_OK' in run_script(SHARDED_SCRIPT, timeout=120)
