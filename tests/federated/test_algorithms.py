"""Identities of the pseudo-gradient algorithms (FedAvg, FedOpt, DiLoCo) on linear regression."""

from __future__ import annotations

import json
import textwrap

import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from paxlike.core import optim
from paxlike.errors import UserError
from paxlike.federated import (diloco, fed_adagrad, fed_adam, fed_avg, fed_yogi,
                               pseudo_gradient)
from tests.federated.regression import (B, REQUIRED, batch_grad, batch_loss, client_batches, close,
                                        initial_params, loss_fn, optax_step, run_rounds)
from tests.helpers import run_script


def _pooled_grad(params, batches, step):
  pooled = jax.tree.map(lambda x: x[:, step].reshape(-1, *x.shape[3:]), batches)
  return batch_grad(params, pooled)


@pytest.mark.parametrize('server_lr', [1.0, 0.5])
def test_fedavg_one_local_step_is_pooled_gradient_descent(server_lr):
  eta, params, batches = 0.1, initial_params(), client_batches(4, 1)
  alg = fed_avg(loss_fn, optax.sgd(eta), optax.sgd(server_lr))
  state, _ = run_rounds(alg, params, 1, batches, np.full(4, float(B), np.float32))
  grad = _pooled_grad(params, batches, 0)
  close(state.params, jax.tree.map(lambda p, g: p - server_lr * eta * g, params, grad))


def test_identical_clients_equal_one_client():
  params, one = initial_params(), client_batches(1, 3)
  many = jax.tree.map(lambda x: np.repeat(x, 4, axis=0), one)
  alg = fed_avg(loss_fn, optax.adam(0.05), optax.sgd(0.8, momentum=0.5))
  s1, m1 = run_rounds(alg, params, 3, one, np.ones(1, np.float32))
  s4, m4 = run_rounds(alg, params, 3, many, np.full(4, 7.0, np.float32))
  close(s4.params, s1.params)
  close({k: m4[k] for k in REQUIRED - {'clients'}}, {k: m1[k] for k in REQUIRED - {'clients'}})


def test_weighted_mean_uses_weights():
  eta, params, batches = 0.2, initial_params(), client_batches(3, 1)
  weights = jnp.array([1.0, 3.0, 6.0])
  state, metrics = run_rounds(fed_avg(loss_fn, optax.sgd(eta)), params, 1, batches, weights)
  per_client = [jax.tree.map(lambda x: x[i, 0], batches) for i in range(3)]
  grads = [batch_grad(params, b) for b in per_client]
  losses = np.array([batch_loss(params, b) for b in per_client])
  w = np.asarray(weights) / 10.0
  want = jax.tree.map(lambda p, *g: p - eta * sum(wi * gi for wi, gi in zip(w, g)),
                      params, *grads)
  close(state.params, want)
  np.testing.assert_allclose(metrics['loss_before'], losses @ w, rtol=1e-5)
  np.testing.assert_allclose(metrics['loss'], losses @ w, rtol=1e-5)  # One step: same batch.


def linear_loss_fn(params, batch, rng):
  """Gradient −mean(batch['g']) whatever the params: one SGD(1) step moves a client by it."""
  del rng
  return -jnp.sum(jnp.mean(batch['g'], axis=0) * params['w']), {}


def _server_moves(alg, deltas):
  """The server params after each round in which the weighted client change is deltas[r]: two
  clients (weights 1 and 3) move by 2.5·Δ and 0.5·Δ (mean Δ), from w = 0."""
  state, step, moves = alg.init({'w': np.zeros(2, np.float32)}), jax.jit(alg.next), []
  for r, delta in enumerate(deltas):
    g = np.array([2.5, 0.5], np.float32)[:, None, None, None] * np.asarray(delta, np.float32)
    batches = {'g': np.broadcast_to(g, (2, 1, 4, 2))}
    state, _ = step(state, batches, np.array([1.0, 3.0], np.float32), jax.random.key(r))
    moves.append(np.asarray(state.params['w']))
  return np.stack(moves)


# Reddi et al. (2021), Algorithm 2, by hand, at η = 1, β1 = 0.9, β2 = 0.99, τ = 1e-3:
# m_t = β1·m + (1 − β1)·Δ_t, v from τ², x += η·m_t / (√v_t + τ), no bias correction.
# FedAdam, Δ = 1e-3 then 2e-3: round 1: m = 1e-4, v = 0.99e-6 + 0.01e-6 = 1e-6,
#   x = 1e-4 / (1e-3 + 1e-3) = 0.05; round 2: m = 9e-5 + 2e-4 = 2.9e-4,
#   v = 0.99e-6 + 0.04e-6 = 1.03e-6, x = 0.05 + 2.9e-4 / (1.014889e-3 + 1e-3) = 0.193929.
# FedYogi, Δ = 2e-3 then 1e-3: round 1: m = 2e-4, v = 1e-6 − 0.01·4e-6·sign(1e-6 − 4e-6)
#   = 1.04e-6, x = 2e-4 / (1.019804e-3 + 1e-3) = 0.099020; round 2: m = 1.8e-4 + 1e-4 = 2.8e-4,
#   v = 1.04e-6 − 0.01·1e-6·sign(0.04e-6) = 1.03e-6, x = 0.099020 + 2.8e-4 / 2.014889e-3 = 0.237985.
# FedAdagrad, Δ = 1e-3 then 2e-3: round 1: m = 1e-4, v = 1e-6 + 1e-6, x = 1e-4 / (1.414214e-3
#   + 1e-3) = 0.041421; round 2: m = 2.9e-4, v = 2e-6 + 4e-6, x = 0.041421 + 2.9e-4 / 3.449490e-3
#   = 0.125492.
@pytest.mark.parametrize('builder, deltas, want', [
    (fed_adam, (1e-3, 2e-3), (0.05, 0.193929)),
    (fed_yogi, (2e-3, 1e-3), (0.099020, 0.237985)),
    (fed_adagrad, (1e-3, 2e-3), (0.041421, 0.125492)),
])
def test_paper_fedopt_first_two_rounds_by_hand(builder, deltas, want):
  alg = builder(linear_loss_fn, optax.sgd(1.0), server_learning_rate=1.0, tau=1e-3)
  moves = _server_moves(alg, [np.array([d, -d]) for d in deltas])
  np.testing.assert_allclose(moves[:, 0], want, rtol=2e-5)
  np.testing.assert_allclose(moves[:, 1], -np.array(want), rtol=2e-5)  # Odd in Δ.


@pytest.mark.parametrize('preset, deltas, want', [
    ('fed_adam', (1e-3, 2e-3), (0.05, 0.193929)),
    ('fed_yogi', (2e-3, 1e-3), (0.099020, 0.237985)),
    ('fed_adagrad', (1e-3, 2e-3), (0.041421, 0.125492)),
    ('fed_avgm', (1e-3, 2e-3), (1e-3, 3.9e-3)),  # Heavy ball: x = 1e-3 + (0.9·1e-3 + 2e-3).
])
def test_configs_presets_build_the_papers_server_optimizers(preset, deltas, want):
  """The configs presets at server lr 1 (hand values as above)."""
  from paxlike.configs import federated as presets
  builder = fdl.build(getattr(presets, preset)(server_learning_rate=1.0))
  moves = _server_moves(builder(linear_loss_fn, optax.sgd(1.0)),
                        [np.full(2, d) for d in deltas])
  np.testing.assert_allclose(moves[:, 0], want, rtol=1e-4)


def test_optax_fedadam_bias_corrects_and_moves_ten_times_further():
  """optax's Adam, round 1: m̂ = Δ, v̂ = Δ², so x moves η·Δ/(|Δ| + τ) = 0.5 (the paper: 0.05)."""
  paper, ours = (fed_adam(linear_loss_fn, optax.sgd(1.0), 1.0, flavour=f)
                 for f in ('paper', 'optax'))
  np.testing.assert_allclose(_server_moves(paper, [np.full(2, 1e-3)])[0], 0.05, rtol=2e-5)
  np.testing.assert_allclose(_server_moves(ours, [np.full(2, 1e-3)])[0], 0.5, rtol=2e-5)
  with pytest.raises(UserError, match='flavour'):
    fed_adam(linear_loss_fn, optax.sgd(1.0), flavour='keras')


def test_fedavg_trains_each_client_separately_then_averages():
  """H = 3 Adam steps on each client's own batches from the server params (fresh state each
  round), then the weighted mean, over 2 rounds."""
  optimizer, H, weights = optax.adam(0.05), 3, np.array([1.0, 2.0, 5.0])
  rounds = [client_batches(3, H, seed=10 + r) for r in range(2)]
  alg, local_step = fed_avg(loss_fn, optimizer), optax_step(optimizer)
  state, step = alg.init(initial_params()), jax.jit(alg.next)
  want = initial_params()
  for r, batches in enumerate(rounds):
    state, _ = step(state, batches, jnp.asarray(weights), jax.random.key(r))
    clients = []
    for i in range(3):
      params, opt_state = want, optimizer.init(want)
      for h in range(H):
        params, opt_state, _ = local_step(params, opt_state,
                                         jax.tree.map(lambda x: x[i, h], batches))
      clients.append(params)
    want = jax.tree.map(lambda *c: sum(w * x for w, x in zip(weights / weights.sum(), c)),
                        *clients)
  close(state.params, want, rtol=1e-4, atol=1e-5)


def test_diloco_default_outer_nesterov_over_two_rounds_by_hand():
  """Inner SGD by hand; outer Nesterov SGD (lr 0.7, μ 0.9) by hand on the weighted pseudo-
  gradient Δ: b = μ·b + Δ, x ← x − 0.7·(Δ + μ·b)."""
  eta, H, weights = 0.1, 2, np.array([1.0, 3.0, 2.0, 2.0])
  rounds = [client_batches(4, H, seed=20 + r) for r in range(2)]
  alg = diloco(loss_fn, optax.sgd(eta), num_replicas=4)
  state, step = alg.init(initial_params()), jax.jit(alg.next)
  x = jax.tree.map(np.asarray, initial_params())
  b = jax.tree.map(np.zeros_like, x)
  for r, batches in enumerate(rounds):
    state, _ = step(state, batches, jnp.asarray(weights), jax.random.key(r))
    replicas = []
    for i in range(4):
      w = x
      for h in range(H):
        grads = batch_grad(w, jax.tree.map(lambda v: v[i, h], batches))
        w = jax.tree.map(lambda p, g: p - eta * np.asarray(g), w, grads)
      replicas.append(w)
    delta = jax.tree.map(lambda p, *c: p - sum(wi * ci for wi, ci in zip(weights / 8, c)),
                         x, *replicas)
    b = jax.tree.map(lambda b, d: 0.9 * b + d, b, delta)
    x = jax.tree.map(lambda x, d, b: x - 0.7 * (d + 0.9 * b), x, delta, b)
  close(state.params, x, rtol=1e-4, atol=1e-5)


def _masked(batches, counts):
  """`batches` with a 'mask' [clients, steps, B] holding counts[i] ones per client."""
  clients, steps = jax.tree.leaves(batches)[0].shape[:2]
  flat = np.arange(steps * B)[None, :] < np.asarray(counts)[:, None]
  return {**batches, 'mask': jnp.asarray(flat.reshape(clients, steps, B), jnp.float32)}


@pytest.mark.parametrize('weighting', ['num_tokens_seen', 'uniform'])
def test_client_weighting(weighting):
  """'num_tokens_seen' weighs client i by its mask count (here 3, 16, 9), 'uniform' equally;
  either equals 'num_examples' given those weights."""
  counts = [3, 16, 9]
  batches, data_weights = _masked(client_batches(3, 2), counts), jnp.array([5.0, 1.0, 1.0])
  got, got_metrics = run_rounds(fed_avg(loss_fn, optax.sgd(0.1), weighting=weighting), initial_params(),
                          2, batches, data_weights)
  weights = np.array(counts if weighting == 'num_tokens_seen' else [1, 1, 1], np.float32)
  want, want_metrics = run_rounds(fed_avg(loss_fn, optax.sgd(0.1)), initial_params(), 2, batches, weights)
  close(got.params, want.params)
  close(got_metrics['loss'], want_metrics['loss'])
  plain, _ = run_rounds(fed_avg(loss_fn, optax.sgd(0.1)), initial_params(), 2, batches, data_weights)
  assert not np.allclose(got.params['w'], plain.params['w'])
  with pytest.raises(UserError, match='weighting'):
    fed_avg(loss_fn, optax.sgd(0.1), weighting='tokens')


def test_local_steps_come_from_the_batches():
  """One FedAvg (SGD, one client) runs as many local steps as its batches have: 1, then 3."""
  eta, alg = 0.1, fed_avg(loss_fn, optax.sgd(0.1))
  for steps in (1, 3):
    batches, want = client_batches(1, steps), initial_params()
    state, _ = run_rounds(alg, want, 1, batches, np.ones(1, np.float32))
    for h in range(steps):
      want = jax.tree.map(lambda p, g: p - eta * g, want, _pooled_grad(want, batches, h))
    close(state.params, want)


def test_diloco_h1_is_data_parallel_sgd():
  eta, alpha, params, batches = 0.1, 0.7, initial_params(), client_batches(4, 1)
  alg = diloco(loss_fn, optax.sgd(eta), optax.sgd(alpha), num_replicas=4)
  state, step = alg.init(params), jax.jit(alg.next)
  want = params
  for r in range(3):
    round_batches = jax.tree.map(lambda x: np.roll(x, r, axis=2), batches)
    state, _ = step(state, round_batches, np.full(4, float(B), np.float32), jax.random.key(r))
    grad = _pooled_grad(want, round_batches, 0)
    want = jax.tree.map(lambda p, g: p - alpha * eta * g, want, grad)
  close(state.params, want)


def test_diloco_single_replica_is_inner_adamw():
  inner, params, batches = optax.adamw(0.05, weight_decay=0.1), initial_params(), client_batches(1, 3)
  rounds = [jax.tree.map(lambda x: np.roll(x, r, axis=2) * (1 + r), batches) for r in range(4)]
  alg = diloco(loss_fn, inner, optax.sgd(1.0), num_replicas=1)
  state, step = alg.init(params), jax.jit(alg.next)
  want, opt_state, local_step = params, inner.init(params), optax_step(inner)
  for r, round_batches in enumerate(rounds):
    state, _ = step(state, round_batches, np.ones(1, np.float32), jax.random.key(r))
    for h in range(3):
      want, opt_state, _ = local_step(want, opt_state,
                                      jax.tree.map(lambda x: x[0, h], round_batches))
  close(state.params, want, rtol=1e-4, atol=1e-5)
  assert int(state.client_opt_state[0].count[0]) == 12  # Inner Adam state persisted.


def test_diloco_checks_replicas():
  with pytest.raises(ValueError, match='num_replicas'):
    diloco(loss_fn, optax.adamw(1e-3))
  alg = diloco(loss_fn, optax.adamw(1e-3), num_replicas=3)
  with pytest.raises(UserError, match='replicas'):  # Also a ValueError; the CLI exits 2.
    alg.next(alg.init(initial_params()), client_batches(2, 2), np.ones(2, np.float32), jax.random.key(0))


@pytest.mark.parametrize('name', ['fed_avg', 'diloco'])
def test_metrics_keys_and_values(name):
  inner = optim.sgd(0.1)  # inject_hyperparams: the learning rate is readable.
  alg = (fed_avg(loss_fn, inner) if name == 'fed_avg'
         else diloco(loss_fn, inner, num_replicas=3))
  params, batches, weights = initial_params(), client_batches(3, 2), jnp.array([1.0, 2.0, 3.0])
  state, metrics = run_rounds(alg, params, 1, batches, weights)
  assert REQUIRED | {'learning_rate', 'mae'} <= set(metrics)
  assert metrics['clients'].dtype == jnp.int32 and int(metrics['clients']) == 3
  assert all(jnp.shape(v) == () for v in metrics.values())
  np.testing.assert_allclose(metrics['learning_rate'], 0.1, rtol=1e-6)
  first = [batch_loss(params, jax.tree.map(lambda x: x[i, 0], batches)) for i in range(3)]
  np.testing.assert_allclose(metrics['loss_before'], np.dot(first, weights) / 6, rtol=1e-5)
  assert metrics['loss_after'] < metrics['loss_before']
  # Server lr: fed_avg 1. The norm of the pseudo-gradient in float64 numpy.
  pseudo = jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64), params,
                        state.params)
  if name == 'fed_avg':
    norm = np.sqrt(sum(np.sum(x**2) for x in jax.tree.leaves(pseudo)))
    np.testing.assert_allclose(metrics['pseudo_grad_norm'], norm, rtol=1e-5)
  no_lr = fed_avg(loss_fn, optax.sgd(0.1))
  assert 'learning_rate' not in run_rounds(no_lr, params, 1, batches, weights)[1]


# A round on a ('clients', 'data') = (2, 4) mesh of 8 CPU devices equals the 1-device round.

_MESH_SCRIPT = textwrap.dedent("""
  import json
  import flax.linen as nn, jax, jax.numpy as jnp, numpy as np, optax
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
  from paxlike.federated import diloco, fed_avg
  from paxlike.trainer.losses import model_loss_fn
  assert jax.device_count() == 8, jax.devices()

  class Tiny(nn.Module):
    @nn.compact
    def __call__(self, x, deterministic=True):
      return nn.Dense(5)(nn.tanh(nn.Dense(16)(x)))

  model, loss_fn = Tiny(), model_loss_fn(Tiny())
  params = model.init(jax.random.key(0), jnp.ones((1, 6)))['params']
  k1, k2 = jax.random.split(jax.random.key(1))
  batches = {'inputs': jax.random.normal(k1, (4, 3, 8, 6)),
             'targets': jax.random.randint(k2, (4, 3, 8), 0, 5),
             'mask': jnp.ones((4, 3, 8))}
  weights = jnp.array([8.0, 4.0, 8.0, 2.0])
  algs = {'fed_avg': fed_avg(loss_fn, optax.sgd(0.3), optax.sgd(0.9, momentum=0.5)),
          'diloco': diloco(loss_fn, optax.adamw(0.01), num_replicas=4)}
  mesh = jax.make_mesh((2, 4), ('clients', 'data'), axis_types=(AxisType.Auto,) * 2)
  results = {}
  for name, alg in algs.items():
    def two_rounds(params, batches, weights):
      state = alg.init(params)
      for r in range(2):
        state, metrics = alg.next(state, batches, weights, jax.random.key(r))
      return state, metrics
    single = jax.jit(two_rounds)(params, batches, weights)
    with jax.set_mesh(mesh):
      sharded_batches = jax.device_put(batches, NamedSharding(mesh, P('clients', None, 'data')))
      sharded_weights = jax.device_put(weights, NamedSharding(mesh, P('clients')))
      sharded = jax.jit(two_rounds)(params, sharded_batches, sharded_weights)
    close = jax.tree.map(lambda a, b: bool(np.allclose(a, b, rtol=1e-4, atol=1e-5)),
                         single, sharded)
    specs = [str(x.sharding.spec) for x in jax.tree.leaves(sharded[0])
             if hasattr(x, 'sharding') and x.ndim and x.shape[0] == 4]
    results[name] = {'close': all(jax.tree.leaves(close)),
                     'loss': float(sharded[1]['loss']), 'client_specs': specs}
  print('RESULTS=' + json.dumps(results))
""")


@pytest.fixture(scope='module')
def mesh_results() -> dict:
  stdout = run_script(_MESH_SCRIPT)
  line = next(l for l in stdout.splitlines() if l.startswith('RESULTS='))
  return json.loads(line.removeprefix('RESULTS='))


@pytest.mark.parametrize('name', ['fed_avg', 'diloco'])
def test_round_on_clients_mesh_matches_one_device(mesh_results, name):
  result = mesh_results[name]
  assert result['close'] and np.isfinite(result['loss'])
  if name == 'diloco':  # The persistent inner state is sharded over the clients axis.
    assert result['client_specs'] and all("'clients'" in s for s in result['client_specs'])


@pytest.mark.parametrize('chunk', [1, 2, 3])
@pytest.mark.parametrize('name', ['fed_avg', 'fed_adam', 'diloco', 'papa', 'btm'])
def test_client_chunks_give_the_same_rounds_as_all_clients_at_once(name, chunk):
  """`client_chunk` trades memory for sequential chunks (3 does not divide the 4 clients)."""
  from paxlike.federated import btm, papa
  builders = {
      'fed_avg': lambda c: fed_avg(loss_fn, optax.sgd(0.1), client_chunk=c),
      'fed_adam': lambda c: fed_adam(loss_fn, optax.sgd(0.1), client_chunk=c),
      'diloco': lambda c: diloco(loss_fn, optax.adam(0.01), num_replicas=4, client_chunk=c),
      'papa': lambda c: papa(loss_fn, optax.adam(0.01), 4, every=1, client_chunk=c),
      'btm': lambda c: btm(loss_fn, optax.adam(0.01), 4, client_chunk=c),
  }
  params, batches, weights = initial_params(), client_batches(4, 2), jnp.array([1.0, 2.0, 3.0, 4.0])
  whole = run_rounds(builders[name](4), params, 2, batches, weights)  # A chunk >= the cohort: vmap.
  close(run_rounds(builders[name](chunk), params, 2, batches, weights), whole)

  def scans(alg):  # The chunked round loops over chunks: one more scan in its program.
    state = alg.init(params)
    return str(jax.make_jaxpr(alg.next)(state, batches, weights, jax.random.key(0))).count('scan[')
  assert scans(builders[name](chunk)) > scans(builders[name](4))


def test_client_chunk_must_be_positive():
  with pytest.raises(ValueError, match='chunk must be a positive int'):
    run_rounds(fed_avg(loss_fn, optax.sgd(0.1), client_chunk=0), initial_params(), 1, client_batches(2, 1),
         np.ones(2, np.float32))
