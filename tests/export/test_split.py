"""Export of federated programs on linear regression: the executor's rounds equal the jitted
round's, placements come out of the primitives, and unsplittable rounds are refused."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from paxlike.errors import UserError
from paxlike.export import artifacts, run, split, trees
from paxlike.federated import (btm, diloco, fed_adam, fed_avg, federated_broadcast, federated_map,
                               federated_mean, federated_program, federated_sum, papa)
from paxlike.federated.scaffold import scaffold

D, B, CLIENTS, STEPS, ROUNDS = 3, 4, 3, 2, 2


def loss_fn(params, batch, rng):
  residual = batch['x'] @ params['w'] + params['b'] - batch['y']
  noise = 0.0 if rng is None else 1e-3 * jax.random.normal(rng, ())  # Uses the client's rng.
  return jnp.mean(residual**2) + noise, {'mae': jnp.mean(jnp.abs(residual))}


def params():
  return {'w': jax.random.normal(jax.random.key(0), (D,)), 'b': jnp.float32(0.5)}


def round_inputs(r: int, clients: int = CLIENTS) -> dict:
  kx, ky = jax.random.split(jax.random.key(100 + r))
  return {'batches': {'x': jax.random.normal(kx, (clients, STEPS, B, D)),
                      'y': jax.random.normal(ky, (clients, STEPS, B))},
          'weights': jnp.arange(1.0, clients + 1.0), 'rng': jax.random.key(r)}


def export_algorithm(out, make, rounds=ROUNDS):
  """Exports `make(CLIENTS)`'s round; client state = the state leaves whose shape follows the
  cohort (as the CLI decides it)."""
  alg = make(CLIENTS)
  state = alg.init(params())
  one = jax.eval_shape(make(1).init, params())
  placed = jax.tree.map(lambda x, y: jnp.shape(x) != y.shape, state, one)
  data = [round_inputs(r) for r in range(rounds)]
  every = lambda tree: jax.tree.map(lambda _: True, tree)
  sizes = artifacts.export(
      out, lambda n: make(n).next, ['state', 'batches', 'weights', 'rng'],
      {'state': placed, 'batches': every(data[0]['batches']), 'weights': True, 'rng': False},
      {'state': state}, data, ['state', 'metrics'], {'algorithm': 'test'})
  return alg, state, data, sizes


def jitted_rounds(alg, state, data):
  step = jax.jit(alg.next)
  for inputs in data:
    state, metrics = step(state, inputs['batches'], inputs['weights'], inputs['rng'])
  return state, metrics


def assert_outputs_equal(executed, state, metrics):
  expected = dict(zip(trees.leaf_names('state', state), jax.tree.leaves(state)))
  expected.update(zip(trees.leaf_names('metrics', metrics), jax.tree.leaves(metrics)))
  assert set(executed) == set(expected)
  for name, value in expected.items():
    np.testing.assert_allclose(executed[name], value, rtol=2e-5, atol=1e-6, err_msg=name)


ALGORITHMS = {
    'fed_avg': lambda n: fed_avg(loss_fn, optax.sgd(0.1)),
    'diloco': lambda n: diloco(loss_fn, optax.adamw(0.05), num_replicas=n),
    'btm': lambda n: btm(loss_fn, optax.adam(0.05), n),
    # Adam's step count is created inside the client scan: unbatched, the same at every client.
    'scaffold': lambda n: scaffold(loss_fn, optax.adam(0.05), n),
}


def test_scaffold_with_a_stateful_client_optimizer_exports(tmp_path):
  """SCAFFOLD's client Adam starts fresh inside each client's scan; its int32 step count has
  no clients axis (vmap leaves it unbatched) and reads no client value, so it is no client
  value: the round exports, the cᵢ are carried at the clients, and the executor's rounds equal
  the jitted ones."""
  alg, state, data, _ = export_algorithm(tmp_path, ALGORITHMS['scaffold'])
  exported = run.load(tmp_path)
  carried = {s['name'] for s in exported.plan['inputs']
             if s['placement'] == 'clients' and s['carried']}
  assert carried == {'state.client_controls.w', 'state.client_controls.b'}
  assert_outputs_equal(run.run_rounds(exported, ROUNDS)[-1], *jitted_rounds(alg, state, data))


def test_btm_exports_its_experts_as_client_state(tmp_path):
  """BTM without a seed phase: experts, their optimizer states and domain weights are carried
  at the clients, the merge is the aggregation; the executor equals the jitted rounds."""
  alg, state, data, _ = export_algorithm(tmp_path, ALGORITHMS['btm'])
  exported = run.load(tmp_path)
  carried = {s['name'] for s in exported.plan['inputs'] if s['placement'] == 'clients'
             and s['carried']}
  assert {'state.experts.w', 'state.domain_examples'} <= carried
  assert not any(c['kind'] == 'broadcast' for c in exported.plan['communication'])
  assert_outputs_equal(run.run_rounds(exported, ROUNDS)[-1], *jitted_rounds(alg, state, data))


def test_plan_places_fedavg_by_its_primitives(tmp_path):
  export_algorithm(tmp_path, ALGORITHMS['fed_avg'], rounds=1)
  plan = run.load(tmp_path).plan
  kinds = [c['kind'] for c in plan['communication']]
  # Down: the per-client rngs (split on the server, one row each), the two params leaves.
  assert kinds[:3] == ['scatter', 'broadcast', 'broadcast'] and set(kinds[3:]) == {'sum'}
  assert [c.get('of') for c in plan['communication'] if c['kind'] == 'sum'].count('weights') == 2
  client_inputs = plan['programs']['client']['inputs']
  assert [d['name'] for d in client_inputs[3:]] == ['batches.x', 'batches.y', 'weights']
  assert client_inputs[3]['shape'] == [STEPS, B, D] and client_inputs[5]['shape'] == []


@pytest.fixture(scope='module')
def diloco_export(tmp_path_factory):
  out = tmp_path_factory.mktemp('diloco') / 'export'
  return (out, *export_algorithm(out, ALGORITHMS['diloco'], rounds=1))


def test_diloco_inner_state_is_client_input_and_output(diloco_export):
  plan = run.load(diloco_export[0]).plan
  client = plan['programs']['client']
  inner = [d['name'] for d in client['inputs'] if d['name'].startswith('state.client_opt_state')]
  assert inner and inner == [d['name'] for d in client['outputs'] if d['name'].startswith('state.')]
  assert all(s['placement'] == 'clients' for s in plan['inputs'] if s['name'] in inner)
  assert all(s['placement'] == 'server' for s in plan['inputs']
             if s['name'].startswith(('state.params', 'state.server_opt_state')))


def test_trees_round_trip(diloco_export):
  out, alg, state, data, _ = diloco_export
  plan = run.load(out).plan
  new_state, metrics = jax.eval_shape(alg.next, state, *data[0].values())
  want = {'inputs': {'state': state, **data[0]},
          'outputs': {'state': new_state, 'metrics': metrics}}
  for side, values in want.items():
    assert set(plan['trees'][side]) == set(values)
    for name, value in values.items():
      assert trees.from_json(plan['trees'][side][name]) == jax.tree.structure(value), name


def fedsgd_gradient(params, batches):
  """jax.grad of a federated program: the mean over clients of their losses at the broadcast
  params."""
  @federated_program(clients=jax.tree.leaves(batches)[0].shape[0])
  def loss(params, batches):
    losses = federated_map(lambda p, b: loss_fn(p, b, None)[0],
                           (federated_broadcast(params), batches))
    return federated_mean(losses)

  return jax.grad(loss)(params, batches)


def test_fedsgd_gradient_exports_with_the_broadcast_transposed_to_a_sum(tmp_path):
  batches = jax.tree.map(lambda x: x[:, 0], round_inputs(0)['batches'])
  artifacts.export(tmp_path, lambda n: fedsgd_gradient, ['params', 'batches'],
                   {'params': {'w': False, 'b': False}, 'batches': {'x': True, 'y': True}},
                   {}, [{'params': params(), 'batches': batches}], ['grads'], {})
  exported = run.load(tmp_path)
  plan = exported.plan
  down = [c for c in plan['communication'] if c['kind'] in ('broadcast', 'scatter')]
  up = [c for c in plan['communication'] if c['kind'] in ('sum', 'mean')]
  assert {c['kind'] for c in down} == {'broadcast'} and [c['kind'] for c in up] == ['sum', 'sum']
  assert [d['name'] for d in plan['programs']['server_post']['inputs']] == ['agg.0', 'agg.1']
  (grads,) = run.run_rounds(exported, 1)
  want = fedsgd_gradient(params(), batches)
  # Independently: the gradient of the plain mean of per-client losses.
  plain = jax.grad(lambda p: jnp.mean(jnp.stack([
      loss_fn(p, jax.tree.map(lambda x: x[i], batches), None)[0] for i in range(CLIENTS)])))(
          params())
  for name in ('w', 'b'):
    np.testing.assert_allclose(grads[f'grads.{name}'], want[name], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads[f'grads.{name}'], plain[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('make', [lambda n: papa(loss_fn, optax.sgd(0.1), n, every=2),
                                  lambda n: btm(loss_fn, optax.sgd(0.1), n, seed_steps=1)],
                         ids=['papa', 'btm_seed'])
def test_averaging_under_cond_is_refused_with_its_reason(tmp_path, make):
  with pytest.raises(split.ExportError, match='inside its body.*lax.cond'):
    export_algorithm(tmp_path, make, rounds=1)
  assert not (tmp_path / 'plan.json').exists()


def export_program(out, fn_at, **values):
  """Exports `fn_at(n)(x, data)`: x at the server, data at the clients."""
  return artifacts.export(out, fn_at, ['x', 'data'], {'x': False, 'data': True}, {},
                          [values], ['y'], {})


def test_sum_of_bools_counts_as_jax_does(tmp_path):
  def above(n):
    @federated_program(clients=n)
    def fn(x, data):
      return federated_sum(federated_map(lambda a, d: a * d > 1.0, (federated_broadcast(x), data)))
    return fn

  x, data = jnp.float32(2.0), jnp.arange(3.0)
  export_program(tmp_path, above, x=x, data=data)
  (outputs,) = run.run_rounds(run.load(tmp_path), 1)
  want = above(3)(x, data)  # Clients 1 and 2: 2 > 1 and 4 > 1.
  assert outputs['y'].dtype == want.dtype == np.int32 and outputs['y'] == want == 2


def test_second_communication_round_is_refused(tmp_path):
  def two_trips(n):
    @federated_program(clients=n)
    def fn(x, data):
      mean = federated_mean(federated_map(jnp.multiply, (federated_broadcast(x), data)))
      return federated_sum(federated_map(jnp.multiply, (federated_broadcast(mean), data)))
    return fn

  with pytest.raises(split.ExportError, match='two communication rounds'):
    export_program(tmp_path, two_trips, x=jnp.float32(2.0), data=jnp.arange(3.0))


def test_cross_client_op_without_primitive_is_refused(tmp_path):
  def leak(n):
    @federated_program(clients=n)
    def fn(x, data):
      mixed = data * jnp.roll(data, 1, axis=0)  # Client i reads client i - 1's data.
      return federated_sum(federated_map(jnp.multiply, (federated_broadcast(x), mixed)))
    return fn

  with pytest.raises(split.ExportError, match='read other clients'):
    export_program(tmp_path, leak, x=jnp.float32(2.0), data=jnp.arange(3.0))


def _sums_all_clients(a, d, data):
  return a * d + jnp.sum(data)  # Every client reads the whole cohort's data.


def _outer_product(a, d, data):
  return a * d + jnp.sum(jnp.outer(data, data)[0])  # [N, N]: two axes follow the cohort.


@pytest.mark.parametrize('client_fn, message', [
    (_sums_all_clients, r'float32\[\] \(equation \d+, reduce_sum\) is computed from client '
     'values but has no clients axis: it combines clients with an ordinary op'),
    (_outer_product, r'float32\[3,3\] \(equation \d+, .*\) is at the clients but its shape '
     r'does not follow the cohort along one clients axis \(float32\[3,3\] at N, '
     r'float32\[4,4\] at N \+ 1'),
], ids=['reduction', 'two_axes'])
def test_value_across_clients_is_refused_naming_its_equation(tmp_path, client_fn, message):
  def leak(n):
    @federated_program(clients=n)
    def fn(x, data):
      return federated_sum(federated_map(lambda a, d: client_fn(a, d, data),
                                         (federated_broadcast(x), data)))
    return fn

  with pytest.raises(split.ExportError, match=message):
    export_program(tmp_path, leak, x=jnp.float32(2.0), data=jnp.arange(3.0))


def test_cohort_size_constant_in_client_code_is_refused(tmp_path):
  def scaled(n):
    @federated_program(clients=n)
    def fn(x, data):
      return federated_sum(federated_map(lambda a, d: a * d / n, (federated_broadcast(x), data)))
    return fn

  with pytest.raises(split.ExportError, match='depends on the number of clients'):
    export_program(tmp_path, scaled, x=jnp.float32(2.0), data=jnp.arange(3.0))


def test_nothing_is_overwritten(tmp_path):
  (tmp_path / 'kept.txt').write_text('mine')
  with pytest.raises(UserError, match='not empty'):
    export_program(tmp_path, lambda n: fedsgd_gradient, x=jnp.float32(1.0), data=jnp.ones(3))
  assert [p.name for p in tmp_path.iterdir()] == ['kept.txt']


def test_executor_refuses_more_rounds_than_exported(diloco_export):
  with pytest.raises(run.PlanError, match='1 to 1 rounds'):
    run.run_rounds(run.load(diloco_export[0]), 2)
