"""A model config its layers reject is the user's error (exit 2); a tracer leaked by the code is
not, and must surface as itself (lm.Llama125M's leak on JAX 0.10 was reported as a bad config)."""

import types

import flax.linen as nn
import jax
import numpy as np
import pytest

from paxlike.errors import UserError
from paxlike.trainer import program

class _Leaky(nn.Module):
  """Fails as JAX does when a layer uses a tracer kept from an earlier trace: a code bug."""

  @nn.compact
  def __call__(self, x):
    raise jax.errors.UnexpectedTracerError('Encountered an unexpected tracer (int8[1,4,4])')


class _BadWidth(nn.Module):
  width: int

  @nn.compact
  def __call__(self, x):
    if self.width <= 0:
      raise ValueError(f'width must be positive, got {self.width}')
    return nn.Dense(self.width)(x)


def test_a_layer_rejecting_its_config_is_a_user_error():
  task = types.SimpleNamespace(model=_BadWidth(width=0))
  with pytest.raises(UserError, match='invalid model config: width must be positive'):
    program._abstract_params(task, np.ones((2, 3), np.float32))


def test_a_leaked_tracer_is_not_blamed_on_the_config():
  task = types.SimpleNamespace(model=_Leaky())
  with pytest.raises(jax.errors.UnexpectedTracerError, match='int8'):
    program._abstract_params(task, np.ones((2, 3), np.float32))
