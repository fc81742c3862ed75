"""Training only part of the params (LoRA's adapters): the frozen leaves stay bitwise, no
gradient of them is computed, and the optimizer state is the trained leaves' alone."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

from paxlike import losses
from paxlike.centralized import centralized, merge_params, split_params
from paxlike.layers import TransformerLM

MODEL = TransformerLM(vocab_size=64, num_layers=1, d_model=32, num_heads=2, d_ff=64, max_len=16)


def norms_only(params):
  """A mask training the norm scales alone (a stand-in for LoRA's adapter mask)."""
  flat = traverse_util.flatten_dict(params)
  return traverse_util.unflatten_dict({k: 'norm' in '/'.join(k) for k in flat})


def batches(seed: int, steps: int = 1):
  tokens = np.random.default_rng(seed).integers(0, 64, (1, steps, 4, 9))
  return {'inputs': jnp.asarray(tokens[..., :-1]), 'targets': jnp.asarray(tokens[..., 1:]),
          'mask': jnp.ones(tokens[..., 1:].shape, jnp.float32)}


def nbytes(tree) -> int:
  return sum(math.prod(np.shape(x)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def test_split_and_merge_are_inverse():
  params = MODEL.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))['params']
  trained, frozen = split_params(params, norms_only)
  assert all('norm' in '/'.join(k) for k in traverse_util.flatten_dict(trained))
  assert not any('norm' in '/'.join(k) for k in traverse_util.flatten_dict(frozen))
  assert jax.tree.structure(merge_params(trained, frozen)) == jax.tree.structure(params)
  assert split_params(params, None) == (params, None)


def test_frozen_leaves_unchanged_and_state_of_trained_leaves_only():
  params = MODEL.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))['params']
  alg = centralized(losses.model_loss_fn(MODEL), optax.adam(1e-2), trainable=norms_only)
  state = alg.init(params)
  trained, frozen = split_params(params, norms_only)
  # Adam's count (int32) and two moments of the trained leaves, nothing of the frozen ones.
  assert nbytes(state.opt_state) == 4 + 2 * nbytes(trained)
  assert nbytes(trained) < nbytes(frozen) / 50
  step = jax.jit(alg.next)
  for i in range(5):
    state, metrics = step(state, batches(i), jnp.ones(1), jax.random.key(i))
  after_trained, after_frozen = split_params(state.params, norms_only)
  for a, b in zip(jax.tree.leaves(after_frozen), jax.tree.leaves(frozen)):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
  assert all(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(after_trained),
                                                      jax.tree.leaves(trained)))
  assert np.isfinite(metrics['loss'])


def test_the_same_update_as_full_training_on_the_trained_leaves():
  """One SGD step: the trained leaves move exactly as full training moves them."""
  params = MODEL.init(jax.random.key(1), jnp.zeros((1, 8), jnp.int32))['params']
  loss_fn = losses.model_loss_fn(MODEL)
  full = centralized(loss_fn, optax.sgd(0.5))
  part = centralized(loss_fn, optax.sgd(0.5), trainable=norms_only)
  args = (batches(7), jnp.ones(1), jax.random.key(0))
  full_state, full_metrics = jax.jit(full.next)(full.init(params), *args)
  part_state, part_metrics = jax.jit(part.next)(part.init(params), *args)
  assert float(full_metrics['loss']) == float(part_metrics['loss'])
  mine, theirs = split_params(part_state.params, norms_only)[0], split_params(
      full_state.params, norms_only)[0]
  for a, b in zip(jax.tree.leaves(mine), jax.tree.leaves(theirs)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def count_dots(alg, params) -> int:
  jaxpr = jax.make_jaxpr(alg.next)(alg.init(params), batches(0), jnp.ones(1), jax.random.key(0))
  return str(jaxpr).count('dot_general')


def test_no_gradient_is_computed_for_frozen_kernels():
  """The step's program: full training has a weight-gradient matmul per kernel that the frozen
  step lacks (JAX transposes only towards the differentiated leaves)."""
  params = MODEL.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))['params']
  loss_fn = losses.model_loss_fn(MODEL)
  full = count_dots(centralized(loss_fn, optax.sgd(0.1)), params)
  frozen = count_dots(centralized(loss_fn, optax.sgd(0.1), trainable=norms_only), params)
  kernels = sum(1 for k in traverse_util.flatten_dict(params) if 'norm' not in '/'.join(k))
  assert full - frozen >= kernels - 1  # (The embedding's gradient is a scatter, not a dot.)
