"""The algorithm tests' task (test_algorithms, test_papa_btm): linear regression of y on D
features, each client's batches shaped [clients, local steps, B, ...]. Inputs are numpy float32
drawn by numpy, and the by-hand references are jitted or numpy: jax.random and eager jnp would
compile a program per op and shape, where the jitted rounds take numpy arrays as they are."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

D, B = 3, 8
# The metrics every algorithm's round reports.
REQUIRED = {'loss', 'clients', 'loss_before', 'loss_after', 'pseudo_grad_norm'}


def loss_fn(params, batch, rng):
  """Mean squared residual of x·w + b against y, with the mean absolute residual as a metric."""
  del rng
  residual = batch['x'] @ params['w'] + params['b'] - batch['y']
  return jnp.mean(residual**2), {'mae': jnp.mean(jnp.abs(residual))}


def normal(rng: np.random.Generator, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
  """Standard normal values of `dtype` from `rng`."""
  return rng.standard_normal(shape).astype(dtype)


def initial_params(seed: int = 0) -> dict[str, np.ndarray]:
  """Random weights and a bias of 0.5."""
  return {'w': normal(np.random.default_rng(seed), (D,)), 'b': np.float32(0.5)}


def client_batches(clients: int, steps: int, seed: int = 1, batch: int = B
                   ) -> dict[str, np.ndarray]:
  """Random x [clients, steps, batch, D] and y [clients, steps, batch]."""
  rng = np.random.default_rng(seed)
  return {'x': normal(rng, (clients, steps, batch, D)), 'y': normal(rng, (clients, steps, batch))}


def close(a, b, rtol: float = 1e-5, atol: float = 1e-6) -> None:
  """Asserts two trees equal leaf by leaf within the tolerances."""
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), a, b)


def run_rounds(alg, params, rounds: int, batches, weights, seed: int = 0):
  """`rounds` jitted rounds of `alg` from `params` on the same batches, round r keyed by
  seed + r: the final state and the last round's metrics."""
  state, step = alg.init(params), jax.jit(alg.next)
  metrics = None
  for r in range(rounds):
    state, metrics = step(state, batches, weights, jax.random.key(seed + r))
  return state, metrics


_loss_and_grad = jax.jit(jax.value_and_grad(lambda p, batch: loss_fn(p, batch, None)[0]))


def batch_loss(params, batch) -> np.ndarray:
  """The loss of `params` on one batch."""
  return np.asarray(_loss_and_grad(params, batch)[0])


def batch_grad(params, batch):
  """The loss's gradient at `params` on one batch, as numpy."""
  return jax.tree.map(np.asarray, _loss_and_grad(params, batch)[1])


@functools.cache
def optax_step(optimizer: optax.GradientTransformation):
  """One plain optax step of the loss on one batch, jitted (a program per optimizer, not one
  per op): (params, opt_state, batch) -> (params, opt_state, the loss before the step), as
  numpy."""
  @jax.jit
  def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(lambda p: loss_fn(p, batch, None)[0])(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss
  return lambda *args: jax.tree.map(np.asarray, step(*args))
