"""Gradient accumulation: the centralized algorithm's micro-batch scan equals one full batch.

`paxlike.trainer.centralized.centralized` takes batches [1, micro_batches, batch, ...] and averages the
micro-batch gradients (lax.scan) before one optimizer update. With equal-sized, fully unmasked
micro-batches that mean is exactly the full-batch gradient, so k micro-batches of b examples
and one batch of k·b give the same update (float32, to rounding).
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from paxlike.trainer import losses
from paxlike.core.algorithm import AlgorithmConfigError
from paxlike.trainer.centralized import centralized
from paxlike.layers import TransformerLM

MODEL = TransformerLM(vocab_size=64, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2,
                      d_ff=64, tied_embeddings=False)
EXAMPLES, SEQ = 8, 16
LOSS_FN = losses.model_loss_fn(MODEL)
ALG = centralized(LOSS_FN, optax.sgd(1.0))  # the update is minus the gradient
STEP = jax.jit(ALG.next)  # shared, so the full-batch step compiles once
# Jitted, so that each compiles one program: eagerly, every op compiles on its own.
INIT = jax.jit(MODEL.init)
FULL_GRAD = jax.jit(jax.grad(lambda p, batch: LOSS_FN(p, batch, None)[0]))


def _batches(micro: int) -> dict[str, jax.Array]:
  """The same 8 sequences as [1, micro, 8 / micro, SEQ] round batches."""
  windows = jax.random.randint(jax.random.key(1), (EXAMPLES, SEQ + 1), 0, 64, dtype=jnp.int32)
  batch = {'inputs': windows[:, :-1], 'targets': windows[:, 1:],
           'mask': jnp.ones((EXAMPLES, SEQ), jnp.float32)}
  return jax.tree.map(lambda x: x.reshape(1, micro, EXAMPLES // micro, *x.shape[1:]), batch)


@pytest.mark.parametrize('micro', [2, 4])
def test_micro_batches_equal_full_batch(micro):
  params = nn.unbox(INIT(jax.random.key(0), _batches(1)['inputs'][0, 0]))['params']
  weights, rng = jnp.ones((1,)), jax.random.key(2)
  full_state, full = STEP(ALG.init(params), _batches(1), weights, rng)
  acc_state, acc = STEP(ALG.init(params), _batches(micro), weights, rng)
  np.testing.assert_allclose(acc['loss'], full['loss'], rtol=1e-6)
  np.testing.assert_allclose(acc['grad_norm'], full['grad_norm'], rtol=1e-5)
  np.testing.assert_allclose(acc['accuracy'], full['accuracy'], rtol=1e-6)
  # Both updates are the gradient of the plain full-batch loss.
  flat = jax.tree.map(lambda x: x[0, 0], _batches(1))
  grads = FULL_GRAD(params, flat)
  for new_full, new_acc, p, g in zip(*(jax.tree.leaves(t) for t in
                                       (full_state.params, acc_state.params, params, grads))):
    np.testing.assert_allclose(new_acc, new_full, atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(p) - np.asarray(new_acc), g, atol=1e-6, rtol=1e-4)


def test_a_cohort_of_two_clients_is_refused():
  """Centralized training is one client: a second one is an error, not silently dropped."""
  params = jax.eval_shape(lambda: nn.unbox(MODEL.init(jax.random.key(0),
                                                      _batches(1)['inputs'][0, 0]))['params'])
  two = jax.tree.map(lambda x: jnp.concatenate([x, x]), _batches(2))
  with pytest.raises(AlgorithmConfigError, match=r'a cohort of 1 client, got 2; set data\.'):
    jax.eval_shape(ALG.next, ALG.init(params), two, jnp.ones((2,)), jax.random.key(2))


@pytest.mark.parametrize('masked_mean', [True, False])
def test_the_step_traces_the_loss_once(masked_mean):
  """The accumulator's zeros are shaped by an eval_shape whose trace the scan reuses: compiling
  the step traces the model's loss once, not twice (for a MaskedMeanLoss and a plain one)."""
  calls = []

  def counted(fn):
    def wrapper(*args):
      calls.append(1)
      return fn(*args)
    return wrapper

  loss_fn = (dataclasses.replace(LOSS_FN, sums=counted(LOSS_FN.sums)) if masked_mean
             else counted(LOSS_FN))
  alg = centralized(loss_fn, optax.sgd(1.0))
  params = jax.eval_shape(lambda: nn.unbox(MODEL.init(jax.random.key(0),
                                                      _batches(1)['inputs'][0, 0]))['params'])
  jax.jit(alg.next).trace(alg.init(params), _batches(4), jnp.ones((1,)), jax.random.key(2))
  assert len(calls) == 1
