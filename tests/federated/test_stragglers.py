"""Systems heterogeneity (data.straggler_fraction): who straggles and for how many steps, the
masked local steps, and FedAvg dropping what FedProx keeps, each against numpy."""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from paxlike.data import ImageData, LmData, sources
from paxlike.errors import UserError
from paxlike.federated import diloco, fed_avg
from paxlike.federated.dp import DpAggregator
from paxlike.federated.papa import papa
from paxlike.federated.scaffold import scaffold
from paxlike.core.algorithm import AlgorithmConfigError
from paxlike.trainer.centralized import centralized
from tests.federated.regression import D, initial_params, run_rounds
from tests.helpers import cli_env, metric_rows, run_cli, run_python

L, ETA, MU = 4, 0.05, 0.5


def linear_loss(params, batch, rng):
  del rng
  residual = batch['x'] @ params['w'] + params['b'] - batch['y']
  return jnp.mean(residual**2), {}


def masked_batches(steps: list[int], seed: int = 1, batch: int = 6) -> dict:
  """Linear-regression batches [clients, L, batch] whose client i runs its first steps[i]
  local steps; the steps it does not run hold other (large) data, which must not count."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(len(steps), L, batch, D)).astype(np.float32)
  y = rng.normal(size=(len(steps), L, batch)).astype(np.float32)
  runs = np.arange(L)[None, :] < np.array(steps)[:, None]
  x, y = np.where(runs[..., None, None], x, 30.0), np.where(runs[..., None], y, -30.0)
  step_mask = np.broadcast_to(runs[..., None], y.shape).astype(np.float32)
  return {'x': x, 'y': y, sources.STEP_MASK: step_mask}


def numpy_client(params: dict, x: np.ndarray, y: np.ndarray, n: int, mu: float = 0.0) -> dict:
  """n steps of SGD (lr ETA) on mean squared error + mu/2 ||w - w0||², by hand."""
  w, b = np.array(params['w'], np.float64), float(params['b'])
  w0, b0 = w.copy(), b
  for s in range(n):
    r = x[s] @ w + b - y[s]
    gw, gb = 2 * x[s].T @ r / len(r) + mu * (w - w0), 2 * r.mean() + mu * (b - b0)
    w, b = w - ETA * gw, b - ETA * gb
  return {'w': w, 'b': b}


def numpy_round(params, batches, steps, weights, mu=0.0) -> dict:
  clients = [numpy_client(params, batches['x'][i], batches['y'][i], n, mu)
             for i, n in enumerate(steps)]
  total = sum(weights)
  return {k: sum(w * c[k] for w, c in zip(weights, clients)) / total for k in ('w', 'b')}


def _assert_close(got, want):
  for k in want:
    np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=2e-5, atol=2e-6)


def test_straggler_steps_are_bernoulli_then_uniform_and_a_function_of_seed_step_slot():
  present = np.ones(4000, bool)
  present[::10] = False  # Padded slots run nothing.
  steps = sources.straggler_steps(3, 7, present, 5, 0.3)
  assert np.all(steps[~present] == 0)
  real = steps[present]
  straggled = real < 5
  assert abs(straggled.mean() - 0.3) < 4 * np.sqrt(0.3 * 0.7 / len(real))
  counts = np.bincount(real[straggled], minlength=5)[1:]  # Steps 1..4, uniform.
  assert counts.sum() == straggled.sum() and np.all(counts > 0)
  expected = straggled.sum() / 4
  assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))
  assert np.array_equal(steps, sources.straggler_steps(3, 7, present, 5, 0.3))
  # Slot i's draw does not depend on how many slots there are.
  assert np.array_equal(sources.straggler_steps(3, 7, present[:50], 5, 0.3), steps[:50])
  assert not np.array_equal(sources.straggler_steps(3, 8, present, 5, 0.3), steps)
  assert not np.array_equal(sources.straggler_steps(4, 7, present, 5, 0.3), steps)
  assert np.array_equal(sources.straggler_steps(3, 7, present, 5, 0.0),
                        np.where(present, 5, 0))


def test_image_round_batches_mask_a_stragglers_later_steps_only():
  kw = dict(num_clients=30, clients_per_round=8, local_steps=L, batch_size=3)
  plain, slow = ImageData(**kw), ImageData(**kw, straggler_fraction=0.6)
  base, base_w = plain.round_batches(2, 5)
  assert sources.STEP_MASK not in base  # Off: the batches are what they were.
  batch, weights = slow.round_batches(2, 5)
  cohort = sources.sample_cohort(2, 5, slow.client_sizes, 8, 'uniform')
  steps = sources.straggler_steps(2, 5, cohort != sources.PADDED, L, 0.6)
  assert 0 < np.sum(steps < L) < 8
  runs = np.arange(L)[None, :] < steps[:, None]
  assert np.array_equal(batch['inputs'], base['inputs'])  # The same examples, the same
  assert np.array_equal(weights, base_w)                   # weights: only what runs differs.
  assert np.array_equal(batch['mask'], np.where(runs[..., None], base['mask'], 0))
  assert np.array_equal(batch[sources.STEP_MASK], np.broadcast_to(runs[..., None], (8, L, 3)))
  block, _ = slow.round_batches(2, 5, clients=slice(2, 6), rows=slice(1, 3))
  for key in batch:
    assert np.array_equal(block[key], batch[key][2:6, :, 1:3])
  again, _ = slow.round_batches(2, 5)
  assert all(np.array_equal(again[k], batch[k]) for k in batch)


@pytest.mark.parametrize('value', [1.0, -0.1, 1.5, True, '0.5'])
def test_a_fraction_outside_zero_one_is_refused(value):
  with pytest.raises(UserError, match='ImageData.straggler_fraction must be a number in'):
    ImageData(straggler_fraction=value, local_steps=2)
  with pytest.raises(UserError, match='LmData.straggler_fraction'):
    LmData(straggler_fraction=value, local_steps=2)


def test_stragglers_need_two_local_steps():
  with pytest.raises(UserError, match=r'straggler_fraction=0.5 needs local_steps >= 2'):
    ImageData(straggler_fraction=0.5, local_steps=1)
  ImageData(straggler_fraction=0.0, local_steps=1)  # Off: any local_steps.


STEPS, WEIGHTS = [4, 1, 3, 4], [3.0, 5.0, 2.0, 1.0]  # Clients 1 and 2 straggle.


def test_fedavg_drops_stragglers_and_a_straggler_is_its_steps_run_alone():
  params, batches = initial_params(), masked_batches(STEPS)
  state, metrics = run_rounds(fed_avg(linear_loss, optax.sgd(ETA)), params, 1, batches,
                        jnp.array(WEIGHTS))
  dropped = [w if n == L else 0.0 for n, w in zip(STEPS, WEIGHTS)]
  _assert_close(state.params, numpy_round(params, batches, STEPS, dropped))
  assert int(metrics['clients']) == 4 and int(metrics['stragglers']) == 2
  # Keeping them (an explicit choice at mu = 0): each straggler counts with its n steps.
  kept, _ = run_rounds(fed_avg(linear_loss, optax.sgd(ETA), drop_stragglers=False), params, 1,
                 batches, jnp.array(WEIGHTS))
  _assert_close(kept.params, numpy_round(params, batches, STEPS, WEIGHTS))


def test_fedprox_keeps_stragglers_partial_work_by_default():
  params, batches = initial_params(), masked_batches(STEPS)
  state, _ = run_rounds(fed_avg(linear_loss, optax.sgd(ETA), prox_mu=MU), params, 1, batches,
                  jnp.array(WEIGHTS))
  _assert_close(state.params, numpy_round(params, batches, STEPS, WEIGHTS, MU))
  dropped, _ = run_rounds(fed_avg(linear_loss, optax.sgd(ETA), prox_mu=MU, drop_stragglers=True),
                    params, 1, batches, jnp.array(WEIGHTS))
  _assert_close(dropped.params, numpy_round(
      params, batches, STEPS, [w if n == L else 0.0 for n, w in zip(STEPS, WEIGHTS)], MU))
  with pytest.raises(AlgorithmConfigError, match='drop_stragglers must be'):
    fed_avg(linear_loss, optax.sgd(ETA), drop_stragglers='yes')


def test_logged_loss_averages_each_client_over_the_steps_it_ran_stragglers_included():
  params, batches = initial_params(), masked_batches(STEPS)
  _, metrics = run_rounds(fed_avg(linear_loss, optax.sgd(ETA)), params, 1, batches,
                    jnp.array(WEIGHTS))
  per_client = []
  for i, n in enumerate(STEPS):  # Loss at each step's start params, by hand.
    losses, p = [], params
    for s in range(n):
      r = batches['x'][i, s] @ np.asarray(p['w']) + float(p['b']) - batches['y'][i, s]
      losses.append(np.mean(r**2))
      p = numpy_client(params, batches['x'][i], batches['y'][i], s + 1)
    per_client.append(np.mean(losses))
  want = np.dot(WEIGHTS, per_client) / np.sum(WEIGHTS)
  np.testing.assert_allclose(float(metrics['loss']), want, rtol=1e-5)


def test_a_skipped_step_leaves_the_optimizer_state_alone():
  """DiLoCo keeps each replica's inner Adam: a straggler's step count is the steps it ran."""
  params, batches = initial_params(), masked_batches(STEPS)
  state, _ = run_rounds(diloco(linear_loss, optax.adam(0.01), num_replicas=4), params, 2, batches,
                  jnp.ones(4))
  counts = [leaf for leaf in jax.tree.leaves(state.client_opt_state)
            if jnp.issubdtype(leaf.dtype, jnp.integer)]
  assert counts and all(np.array_equal(c, 2 * np.array(STEPS)) for c in counts)


def test_dp_leaves_a_dropped_straggler_out_of_the_clipped_sum():
  params, batches = initial_params(), masked_batches(STEPS)
  agg = DpAggregator(clip_norm=1e6, noise_multiplier=0.0)  # No clipping, no noise: a mean.
  state, metrics = run_rounds(fed_avg(linear_loss, optax.sgd(ETA), aggregator=agg), params, 1,
                        batches, jnp.array(WEIGHTS))
  clients = [numpy_client(params, batches['x'][i], batches['y'][i], n)
             for i, n in enumerate(STEPS)]
  kept = [c for c, n in zip(clients, STEPS) if n == L]
  for k in ('w', 'b'):  # Sum of the kept updates over the 4 slots (uniform: n = slots).
    delta = sum(np.asarray(params[k]) - c[k] for c in kept) / 4
    np.testing.assert_allclose(np.asarray(state.params[k]), np.asarray(params[k]) - delta,
                               rtol=2e-5, atol=2e-6)
  assert float(metrics['dp_cohort_size']) == 2


@pytest.mark.parametrize('build, clients', [
    (lambda: scaffold(linear_loss, optax.sgd(ETA), num_clients=4), 4),
    (lambda: papa(linear_loss, optax.sgd(ETA), population=4), 4),
    (lambda: centralized(linear_loss, optax.sgd(ETA)), 1),
])
def test_algorithms_that_run_every_step_refuse_stragglers(build, clients):
  alg, batches = build(), jax.tree.map(lambda x: x[:clients], masked_batches(STEPS))
  with pytest.raises(AlgorithmConfigError, match='data.straggler_fraction'):
    jax.eval_shape(alg.next, alg.init(initial_params()), batches, jnp.ones(clients), jax.random.key(0))


@pytest.mark.slow
def test_cli_rows_count_the_stragglers_and_a_resumed_run_repeats_them(tmp_path):
  args = ['--exp=federated.DigitsFedAvg', '--fdl_set=data.straggler_fraction=0.6',
          '--fdl_set=train.num_steps=4', '--fdl_set=train.log_every=1',
          '--fdl_set=train.eval_every=4', '--fdl_set=train.checkpoint_every=2']
  run_cli(*args, f'--job_log_dir={tmp_path / "full"}')
  rows = metric_rows(tmp_path / 'full')
  want = [int(np.sum(sources.straggler_steps(0, s, np.ones(5, bool), 5, 0.6) < 5))
          for s in range(1, 5)]
  assert [r['stragglers'] for r in rows] == want and all(r['clients'] == 5 for r in rows)
  # Killed after round 2: the restored state and (seed, step) give the same stragglers.
  half = tmp_path / 'half'
  shutil.copytree(tmp_path / 'full', half)
  shutil.rmtree(half / 'checkpoints' / '4')
  kept = [l for l in (half / 'metrics.jsonl').read_text().splitlines()
          if json.loads(l)['step'] <= 2]
  (half / 'metrics.jsonl').write_text(''.join(f'{l}\n' for l in kept))
  proc = run_cli(*args, f'--job_log_dir={half}')
  assert 'resumed from checkpoint step 2' in proc.stderr
  assert metric_rows(half) == rows
  bad = run_cli(*args[:1], '--fdl_set=data.straggler_fraction=1.0',
                f'--job_log_dir={tmp_path / "bad"}', check=False)
  assert bad.returncode == 2 and 'straggler_fraction must be a number in [0, 1)' in bad.stderr


@pytest.mark.slow
def test_a_round_with_partial_work_still_exports_as_one_round_trip(tmp_path):
  """The step mask's guards sit on the server after the sums: no second round trip (a
  Poisson cohort's padded slots and stragglers take the same path)."""
  proc = run_python(['-m', 'paxlike.export', '--exp=federated.DigitsFedAvg',
                     '--fdl_set=data.sampling="poisson"', f'--out={tmp_path}'], cli_env(1),
                    timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert json.loads((tmp_path / 'plan.json').read_text())
