"""paxlike.core.optim: the warmup-cosine schedule kept as numbers in the optimizer state is
optax's schedule to the bit, and a preset's learning rate is read back from its state."""

import jax
import numpy as np
import optax
import pytest

from paxlike.core import optim

# (peak, decay steps, warmup steps (None: the preset's), end fraction): the presets' shape, a
# one-step run (no warmup), explicit warmups, and end fractions whose 1 - f rounds in float32.
CASES = [(3e-3, 20, None, 0.1), (1e-3, 1, None, 0.1), (0.05, 7, 2, 0.0), (0.3, 100, 50, 0.25),
         (0.1756, 425, None, 0.8631789), (0.6505, 84, None, 0.6884467), (0.3379, 485, 3, 0.3916)]


@pytest.mark.parametrize('peak, decay, warmup, end', CASES)
def test_warmup_cosine_from_traced_numbers_is_optaxs_schedule(peak, decay, warmup, end):
  schedule = optim.warmup_cosine(peak, decay, warmup, end)
  reference = optax.warmup_cosine_decay_schedule(0.0, peak, schedule.warmup_steps, decay,
                                                 peak * end)
  counts = np.arange(decay + 3, dtype=np.int32)
  # The numbers as float32 and int32 arrays, as inject_hyperparams keeps them.
  numbers = tuple(np.asarray(x, np.int32 if isinstance(x, int) else np.float32) for x in schedule)
  got = jax.jit(lambda n, c: optim.WarmupCosine(*n)(c))(numbers, counts)
  np.testing.assert_array_equal(got, jax.jit(reference)(counts))
  # From 0 (a run without warmup starts at the peak), at the peak when the warmup ends.
  assert float(got[0]) == (0.0 if schedule.warmup_steps else np.float32(peak))
  assert float(got[schedule.warmup_steps]) == np.float32(peak)


def test_warmup_cosine_refuses_a_warmup_as_long_as_the_decay():
  with pytest.raises(ValueError,
                     match='0 <= warmup_steps < decay_steps.*warmup_steps=5, decay_steps=5'):
    optim.warmup_cosine(1e-3, decay_steps=5, warmup_steps=5)


@pytest.mark.parametrize('make', [optim.adamw, optim.sgd])
def test_the_rate_of_each_step_is_read_from_the_state_and_the_numbers_are_inputs(make):
  """Two learning rates and run lengths, one traced update: the schedule's numbers are state."""
  params = {'w': np.ones(3, np.float32)}
  grads = {'w': np.full(3, 0.5, np.float32)}

  def rates(schedule, steps):
    optimizer = make(schedule)

    @jax.jit
    def update(state):
      _, state = optimizer.update(grads, state, params)
      return state, optim.learning_rate_of(state)
    state, out = optimizer.init(params), []
    for _ in range(steps):
      state, rate = update(state)
      out.append(float(rate))
    return out, update.lower(optimizer.init(params)).as_text()

  first, text_a = rates(optim.warmup_cosine(2e-3, 6), 6)
  second, text_b = rates(optim.warmup_cosine(5e-2, 9, end_fraction=0.3), 9)
  for schedule, got in ((optax.warmup_cosine_decay_schedule(0.0, 2e-3, 1, 6, 2e-4), first),
                        (optax.warmup_cosine_decay_schedule(0.0, 5e-2, 1, 9, 1.5e-2), second)):
    np.testing.assert_allclose(got, [schedule(i) for i in range(len(got))], rtol=1e-6, atol=0)
  assert text_a == text_b  # One program for both runs.
