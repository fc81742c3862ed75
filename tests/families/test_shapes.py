"""XLA's FLOP count of a compiled program: a matmul's is its 2·m·k·n multiply-adds."""

import jax
import jax.numpy as jnp
import pytest

from paxlike.families import shapes


def test_step_flops_match_a_matmul_count():
  a = jnp.ones((64, 128), jnp.float32)
  b = jnp.ones((128, 32), jnp.float32)
  compiled = jax.jit(jnp.matmul).lower(a, b).compile()
  assert shapes.step_flops_per_device(compiled) == pytest.approx(2 * 64 * 128 * 32, rel=0.05)


def test_gradient_flops_count_the_backward_pass_too():
  """A linear loss's gradient is its forward matmul plus one more of the same size."""
  x = jnp.ones((16, 64), jnp.float32)
  params = jnp.ones((64, 8), jnp.float32)

  def loss_fn(w, batch, rng):
    del rng
    return jnp.sum(batch @ w), {}

  forward = 2 * 16 * 64 * 8
  assert shapes.gradient_flops(loss_fn, params, x) == pytest.approx(2 * forward, rel=0.1)
