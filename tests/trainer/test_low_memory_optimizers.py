"""The optimizers that fit the biggest model a chip holds: AdamW with both moments in bfloat16
(optim.adamw(moments_dtype='bfloat16'), the `bf16_moments` fiddler) and Adafactor (the
`adafactor` fiddler): their numbers against an independent float32 AdamW, their state's bytes in
the memory estimate, and a checkpointed run resumed exactly."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.configs import fiddlers
from paxlike.config import config_io
from paxlike.core import optim
from paxlike.families import lm_memory
from paxlike.trainer import build, loop
from tests.helpers import metric_rows
from tests.tiny_task import tiny_config, with_steps


def reference_adamw(params, grads_per_step, lr, b1, b2, eps, weight_decay):
  """AdamW in float64 numpy, written from the paper's update (bias-corrected moments)."""
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  mu = {k: np.zeros_like(v) for k, v in p.items()}
  nu = {k: np.zeros_like(v) for k, v in p.items()}
  for t, grads in enumerate(grads_per_step, start=1):
    for k in p:
      g = np.asarray(grads[k], np.float64)
      mu[k] = b1 * mu[k] + (1 - b1) * g
      nu[k] = b2 * nu[k] + (1 - b2) * g * g
      step = (mu[k] / (1 - b1**t)) / (np.sqrt(nu[k] / (1 - b2**t)) + eps)
      p[k] = p[k] - lr * (step + weight_decay * p[k])
  return p, mu, nu


def test_bf16_moments_follow_a_float32_adamw_within_bf16_rounding():
  rng = np.random.default_rng(0)
  params = {'w': rng.normal(size=(16, 8)).astype(np.float32),
            'b': rng.normal(size=(8,)).astype(np.float32)}
  grads = [{k: rng.normal(scale=0.1, size=v.shape).astype(np.float32) for k, v in params.items()}
           for _ in range(6)]
  lr, b1, b2, eps, wd = 1e-2, 0.9, 0.95, 1e-8, 0.1
  opt = optim.adamw(lr, b1, b2, eps, wd, clip_norm=None, moments_dtype='bfloat16')
  state = opt.init(params)
  p = jax.tree.map(jnp.asarray, params)
  update = jax.jit(opt.update)
  for g in grads:
    u, state = update(g, state, p)
    p = jax.tree.map(lambda a, b: a + b, p, u)
  want, mu, nu = reference_adamw(params, grads, lr, b1, b2, eps, wd)
  adam = state.inner_state[0]
  for k in params:
    assert adam.mu[k].dtype == adam.nu[k].dtype == jnp.bfloat16
    # Each stored moment is the float32 one rounded to bf16 (8 bits: relative 2^-8), with the
    # rounding of earlier steps carried along.
    np.testing.assert_allclose(np.asarray(adam.mu[k], np.float64), mu[k], rtol=2e-2, atol=1e-4)
    np.testing.assert_allclose(np.asarray(adam.nu[k], np.float64), nu[k], rtol=2e-2, atol=1e-6)
    moved, moved_ref = np.asarray(p[k], np.float64) - params[k], want[k] - params[k]
    np.testing.assert_allclose(moved, moved_ref, rtol=2e-2, atol=lr * 2e-2)
    # And not float32 AdamW itself: the bf16 rounding shows.
  f32 = optim.adamw(lr, b1, b2, eps, wd, clip_norm=None)
  s32, p32 = f32.init(params), jax.tree.map(jnp.asarray, params)
  for g in grads:
    u, s32 = f32.update(g, s32, p32)
    p32 = jax.tree.map(lambda a, b: a + b, p32, u)
  assert any(not np.array_equal(p[k], p32[k]) for k in params)


def test_the_estimate_counts_bf16_moments_and_adafactor():
  """The tiny task's params n: float32 AdamW holds 2·4n bytes of moments, bf16 2·2n, Adafactor
  a factored second moment of each matrix (a row and a column) and each vector whole."""
  def optimizer_bytes(fiddler=None):
    cfg = tiny_config()
    if fiddler:
      fiddler(cfg)
    task = config_io.build(cfg)
    est = lm_memory.estimate(task, 1)
    return est.optimizer, est.params / 4, task
  adam, n, task = optimizer_bytes()
  bf16, _, _ = optimizer_bytes(fiddlers.bf16_moments)
  factored, _, factored_task = optimizer_bytes(fiddlers.adafactor)
  assert 8 * n <= adam < 8 * n + 1024 and 4 * n <= bf16 < 4 * n + 1024
  shapes = [x.shape for x in jax.tree.leaves(jax.eval_shape(
      factored_task.model.init, jax.random.key(0), jnp.zeros((1, 16), jnp.int32))['params'])]
  # optax factors a matrix whose two largest dims are >= 128 (min_dim_size_to_factor); the tiny
  # model's are smaller, so its second moments are whole: n floats, plus per-leaf scalars.
  whole = sum(int(np.prod(s)) for s in shapes if sorted(s)[-2:][0] < 128 or len(s) < 2)
  assert whole * 4 <= factored < whole * 4 + 64 * len(shapes) + 1024
  assert factored < adam / 1.9


@pytest.mark.slow
def test_a_bf16_moment_run_resumes_exactly_from_its_checkpoint(tmp_path):
  """6 steps straight against 4 + a resume to 6 from the step-4 checkpoint: the same training
  rows, to the bit (the bf16 moments are saved and restored as they are)."""
  cfg = tiny_config('train.log_every=1', 'train.checkpoint_every=2', 'train.eval_every=100')
  fiddlers.bf16_moments(cfg)
  placed = build.setup(config_io.build(cfg))
  dtypes = [x.dtype for x in jax.tree.leaves(placed.program.abstract_state)]
  # Two bf16 moments per parameter leaf, and nothing else in bf16 (the params are float32).
  assert dtypes.count(jnp.dtype(jnp.bfloat16)) == 2 * len(
      jax.tree.leaves(placed.program.abstract_params))
  loop.train(with_steps(placed, 6), tmp_path / 'straight')
  loop.train(with_steps(placed, 4), tmp_path / 'resumed')
  loop.train(with_steps(placed, 6), tmp_path / 'resumed')
  # Timing fields aside; a run's last step also evaluates (the first leg's step 4).
  drop = lambda rows: [{k: v for k, v in r.items()  # noqa: E731
                        if not k.startswith('eval_') and not any(
                            t in k for t in ('per_sec', 'time', 'mfu', 'flops', 'eta'))}
                       for r in rows]
  assert drop(metric_rows(tmp_path / 'resumed')) == drop(metric_rows(tmp_path / 'straight'))
  assert [r['step'] for r in metric_rows(tmp_path / 'straight')] == [1, 2, 3, 4, 5, 6]
