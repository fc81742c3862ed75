"""The masked loss: its call is the masked mean, and `value_and_mean_grad` (sums differentiated,
divided after) gives the loss, accuracy and gradient of that mean computed independently here;
an empty mask gives zeros; a MoE model's loss (not a mean over targets) is differentiated as is."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from paxlike.layers import TransformerLM
from paxlike.core.loss import MaskedMeanLoss, value_and_mean_grad
from paxlike.trainer import losses

MODEL = TransformerLM(vocab_size=32, num_layers=1, d_model=16, num_heads=2, d_ff=32, max_len=8)
TOKENS = np.random.default_rng(0).integers(0, 32, (4, 9))
MASK = np.array([[1] * 8, [1] * 5 + [0] * 3, [0] * 8, [1, 0] * 4], np.float32)
BATCH = {'inputs': TOKENS[:, :-1], 'targets': TOKENS[:, 1:], 'mask': MASK}
# Jitted inits and gradients compile one program each: eagerly, every op compiles on its own.
PARAMS = nn.unbox(jax.jit(MODEL.init)(jax.random.key(0), TOKENS[:, :-1]))['params']


def reference(params, batch):
  """The mean cross-entropy over the unmasked targets, written from optax alone."""
  logits = MODEL.apply({'params': params}, batch['inputs'])
  xent = optax.softmax_cross_entropy_with_integer_labels(logits, batch['targets'])
  return jnp.sum(xent * batch['mask']) / jnp.sum(batch['mask']), logits


def test_the_loss_is_a_masked_mean_and_its_mean_grad_is_the_means_gradient():
  loss_fn = losses.model_loss_fn(MODEL)
  assert isinstance(loss_fn, MaskedMeanLoss)
  (loss, metrics), grads = jax.jit(value_and_mean_grad(loss_fn))(PARAMS, BATCH, None)
  (want, logits), want_grads = jax.jit(jax.value_and_grad(reference, has_aux=True))(PARAMS, BATCH)
  correct = np.asarray(np.argmax(np.asarray(logits), -1) == BATCH['targets'], np.float32)
  np.testing.assert_allclose(loss, want, rtol=1e-6)
  np.testing.assert_allclose(metrics['accuracy'], (correct * MASK).sum() / MASK.sum(), rtol=1e-6)
  for got, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
  called, called_metrics = jax.jit(loss_fn)(PARAMS, BATCH, None)  # The call: the same means.
  np.testing.assert_allclose(called, loss, rtol=1e-6)
  np.testing.assert_allclose(called_metrics['accuracy'], metrics['accuracy'], rtol=1e-6)


def test_the_view_is_applied_before_the_loss_and_the_gradient_is_of_the_viewed_params():
  loss_fn = losses.model_loss_fn(MODEL)
  halve = lambda p: jax.tree.map(lambda x: x / 2, p)
  (loss, _), grads = jax.jit(value_and_mean_grad(loss_fn, halve))(PARAMS, BATCH, None)
  want, want_grads = jax.jit(jax.value_and_grad(lambda p: reference(halve(p), BATCH)[0]))(PARAMS)
  np.testing.assert_allclose(loss, want, rtol=1e-6)
  for got, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)


def test_an_empty_mask_gives_zero_loss_and_zero_gradient():
  empty = {**BATCH, 'mask': np.zeros_like(MASK)}
  (loss, metrics), grads = jax.jit(value_and_mean_grad(losses.model_loss_fn(MODEL)))(
      PARAMS, empty, None)
  assert loss == 0 and metrics['accuracy'] == 0
  assert all(not np.any(np.asarray(g)) for g in jax.tree.leaves(grads))


def test_a_moe_loss_is_differentiated_as_it_is():
  moe_model = MODEL.clone(num_experts=2, experts_per_token=1, capacity_factor=2.0)
  params = nn.unbox(jax.jit(moe_model.init)(jax.random.key(0), TOKENS[:, :-1]))['params']
  loss_fn = losses.model_loss_fn(moe_model)
  assert not isinstance(loss_fn, MaskedMeanLoss)
  (loss, metrics), grads = jax.jit(value_and_mean_grad(loss_fn))(params, BATCH, None)
  (want, want_metrics), want_grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(
      params, BATCH, None)
  assert loss == want and metrics == want_metrics
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(grads),
                                                  jax.tree.leaves(want_grads)))
