"""FedOpt's adaptive server optimizers exactly as Reddi et al. (2021), Algorithm 2, write them.

With Δ_t the averaged client change (the negative pseudo-gradient):

  m_t = β1·m_{t−1} + (1 − β1)·Δ_t                       (m_{−1} = 0)
  v_t = v_{t−1} + Δ_t²                                   FedAdagrad
  v_t = v_{t−1} − (1 − β2)·Δ_t²·sign(v_{t−1} − Δ_t²)      FedYogi
  v_t = β2·v_{t−1} + (1 − β2)·Δ_t²                       FedAdam      (v_{−1} = τ²)
  x_{t+1} = x_t + η·m_t / (√v_t + τ)

No bias correction, and τ both starts v and guards the division. optax's `adam`, `yogi` and
`adagrad` differ (bias correction, v from 0, no server momentum for Adagrad), and so move
10× further in the first round at the paper's defaults; `paxlike.federated.fed_adam(...,
flavour='optax')` keeps them. Moments are kept in float32 (or wider).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

SecondMoment = Callable[[jax.Array, jax.Array], jax.Array]  # (v_{t−1}, Δ_t²) -> v_t


class AdaptiveServerState(NamedTuple):
  """The first and second moments m and v (float32 or wider, like the params)."""

  m: Any
  v: Any


def scale_by_adaptive_server(second_moment: SecondMoment, b1: float,
                             tau: float) -> optax.GradientTransformation:
  """Pseudo-gradients g = −Δ → m/(√v + τ) (with m of g), Algorithm 2 before the server rate."""

  def wide(x):
    return jnp.promote_types(x.dtype, jnp.float32)

  def init(params):
    return AdaptiveServerState(
        jax.tree.map(lambda p: jnp.zeros(p.shape, wide(p)), params),
        jax.tree.map(lambda p: jnp.full(p.shape, tau**2, wide(p)), params))

  def update(grads, state, params=None):
    del params
    g = jax.tree.map(lambda x: x.astype(wide(x)), grads)
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.m, g)
    v = jax.tree.map(lambda v, g: second_moment(v, g * g), state.v, g)
    updates = jax.tree.map(lambda m, v, x: (m / (jnp.sqrt(v) + tau)).astype(x.dtype), m, v, grads)
    return updates, AdaptiveServerState(m, v)

  return optax.GradientTransformation(init, update)


def adam(learning_rate: float, b1: float = 0.9, b2: float = 0.99,
         tau: float = 1e-3) -> optax.GradientTransformation:
  """FedAdam's server optimizer (Algorithm 2)."""
  return optax.chain(
      scale_by_adaptive_server(lambda v, g2: b2 * v + (1 - b2) * g2, b1, tau),
      optax.scale_by_learning_rate(learning_rate))


def yogi(learning_rate: float, b1: float = 0.9, b2: float = 0.99,
         tau: float = 1e-3) -> optax.GradientTransformation:
  """FedYogi's server optimizer (Algorithm 2)."""
  return optax.chain(
      scale_by_adaptive_server(lambda v, g2: v - (1 - b2) * g2 * jnp.sign(v - g2), b1, tau),
      optax.scale_by_learning_rate(learning_rate))


def adagrad(learning_rate: float, b1: float = 0.9,
            tau: float = 1e-3) -> optax.GradientTransformation:
  """FedAdagrad's server optimizer (Algorithm 2: with server momentum β1)."""
  return optax.chain(scale_by_adaptive_server(lambda v, g2: v + g2, b1, tau),
                     optax.scale_by_learning_rate(learning_rate))
