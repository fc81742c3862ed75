"""Training only part of the params (LoRA's adapters): the frozen leaves stay bitwise, no
gradient of them is computed, and the optimizer state is the trained leaves' alone; LoRA runs
resume bitwise (federated LoRA: tests/federated/test_federated_lora.py)."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from paxlike.trainer import build, loop, losses
from paxlike.core.trainable import merge_params, split_params
from paxlike.trainer.centralized import centralized
from paxlike.layers import TransformerLM
from paxlike.layers.lora import lora_mask
from tests.helpers import run_script
from tests.tiny_task import restored, tiny_task, with_steps

MODEL = TransformerLM(vocab_size=64, num_layers=1, d_model=32, num_heads=2, d_ff=64, max_len=16)
_INIT = jax.jit(MODEL.init)  # One program: eagerly, every op of the init compiles on its own.


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
  params = _INIT(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))['params']
  trained, frozen = split_params(params, norms_only)
  assert all('norm' in '/'.join(k) for k in traverse_util.flatten_dict(trained))
  assert not any('norm' in '/'.join(k) for k in traverse_util.flatten_dict(frozen))
  assert jax.tree.structure(merge_params(trained, frozen)) == jax.tree.structure(params)
  assert split_params(params, None) == (params, None)


def test_frozen_leaves_unchanged_and_state_of_trained_leaves_only():
  params = _INIT(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))['params']
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
  params = _INIT(jax.random.key(1), jnp.zeros((1, 8), jnp.int32))['params']
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
  params = _INIT(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))['params']
  loss_fn = losses.model_loss_fn(MODEL)
  full = count_dots(centralized(loss_fn, optax.sgd(0.1)), params)
  frozen = count_dots(centralized(loss_fn, optax.sgd(0.1), trainable=norms_only), params)
  kernels = sum(1 for k in traverse_util.flatten_dict(params) if 'norm' not in '/'.join(k))
  assert full - frozen >= kernels - 1  # (The embedding's gradient is a scatter, not a dot.)


# The trainer with a LoRA model (model.lora_rank > 0): lora_mask freezes the base.

@pytest.fixture(scope='module')
def lora_placed():
  return build.setup(tiny_task('model.lora_rank=4', 'train.checkpoint_every=1',
                               'train.max_to_keep=5'))



def test_lora_run_trains_only_the_adapters(lora_placed, tmp_path):
  placed = lora_placed
  loop.train(with_steps(placed, 5), tmp_path)
  with jax.set_mesh(placed.program.mesh):
    start = placed.program.init(jax.random.key(placed.task.train.seed))
  end = restored(placed, tmp_path, 5)
  base0, base5 = (split_params(s.alg.params, lora_mask)[1] for s in (start, end))
  adapters0, adapters5 = (split_params(s.alg.params, lora_mask)[0] for s in (start, end))
  assert [np.asarray(x).tobytes() for x in jax.tree.leaves(base5)] == [
      np.asarray(x).tobytes() for x in jax.tree.leaves(base0)]
  names = traverse_util.flatten_dict(adapters5, sep='/')
  assert sorted(names) == ['block_0/attention/query_lora_a', 'block_0/attention/query_lora_b',
                           'block_0/attention/value_lora_a', 'block_0/attention/value_lora_b']
  assert not np.any(np.asarray(adapters0['block_0']['attention']['query_lora_b']))  # B = 0.
  assert all(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(adapters5),
                                                      jax.tree.leaves(adapters0)))
  # Optimizer state: what the optimizer keeps without params (count, schedule) plus AdamW's two
  # moments of each adapter, nothing of the base.
  overhead = nbytes(placed.task.optimizer.init({}))
  assert nbytes(end.alg.opt_state) == overhead + 2 * nbytes(adapters0)
  assert 2 * nbytes(adapters0) < nbytes(base0) / 10


def test_lora_resumes_bitwise(lora_placed, tmp_path):
  loop.train(with_steps(lora_placed, 3), tmp_path / 'whole')
  loop.train(with_steps(lora_placed, 2), tmp_path / 'parts')
  loop.train(with_steps(lora_placed, 3), tmp_path / 'parts')
  a, b = restored(lora_placed, tmp_path / 'whole', 3), restored(lora_placed, tmp_path / 'parts', 3)
  assert [np.asarray(x).tobytes() for x in jax.tree.leaves(a)] == [
      np.asarray(x).tobytes() for x in jax.tree.leaves(b)]


def test_benchmark_quick_run():
  """python -m benchmarks.lora --quick: AdamW's state is its count plus two moments of exactly the
  trained params on each side; LoRA trains a small fraction."""
  out = run_script('import runpy, sys; sys.argv = ["benchmarks.lora", "--quick"]; '
                   'runpy.run_module("benchmarks.lora", run_name="__main__", alter_sys=True)',
                   devices=1)
  result = json.loads(out.strip().splitlines()[-1])
  for name in ('full', 'lora'):
    side = result[name]
    assert side['opt_state_bytes'] == 4 + 2 * 4 * side['trained_params']
    assert side['ms_per_step'] > 0
  assert result['lora']['trained_params'] < result['full']['trained_params'] / 10
  assert result['opt_state_ratio'] == pytest.approx(
      result['lora']['opt_state_bytes'] / result['full']['opt_state_bytes'])
