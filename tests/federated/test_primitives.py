"""Tests for paxlike.federated.primitives."""

from __future__ import annotations

import json
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.interpreters import ad

from paxlike.federated import (federated_broadcast, federated_map, federated_mean,
                               federated_program, federated_sum, federated_weighted_mean)
from paxlike.federated import primitives
from tests.helpers import run_script

N = 3
D = 4


def _rand(seed: int, shape: tuple[int, ...]) -> jax.Array:
  """Standard normal float32 drawn by numpy (jax.random compiles a program per shape)."""
  return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def _vdot(a, b) -> float:
  """Inner product of two pytrees with the same structure (in numpy: no compile per shape)."""
  return sum(np.vdot(np.asarray(x, np.float64), np.asarray(y, np.float64))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


broadcast = federated_program(clients=N)(federated_broadcast)
fsum = federated_program(clients=N)(federated_sum)
fmean = federated_program(clients=N)(federated_mean)


def _jaxpr_primitives(fn, *args) -> set[str]:
  return {eqn.primitive.name for eqn in jax.make_jaxpr(fn)(*args).jaxpr.eqns}


# Placement and shapes.


def test_shapes_on_pytrees() -> None:
  server = {'w': jnp.ones((2, 5)), 'b': jnp.float32(1.0)}
  clients = broadcast(server)
  assert clients['w'].shape == (N, 2, 5) and clients['b'].shape == (N,)
  np.testing.assert_array_equal(clients['w'][1], server['w'])
  for reduce in (fsum, fmean):
    out = reduce(clients)
    assert out['w'].shape == (2, 5) and out['b'].shape == ()
  np.testing.assert_allclose(fsum(clients)['w'], N * server['w'])
  np.testing.assert_allclose(fmean(clients)['w'], server['w'])


def test_values_match_numpy() -> None:
  y = _rand(0, (N, D))
  np.testing.assert_allclose(fsum(y), np.sum(y, 0), rtol=1e-6)
  np.testing.assert_allclose(fmean(y), np.mean(y, 0), rtol=1e-6)
  np.testing.assert_allclose(jax.jit(fmean)(y), np.mean(y, 0), rtol=1e-6)


def test_outside_program_raises() -> None:
  for op in (federated_broadcast, federated_sum, federated_mean):
    with pytest.raises(RuntimeError, match='federated_program'):
      op(jnp.ones((N, D)))
  with pytest.raises(RuntimeError, match='federated_program'):
    federated_map(jnp.sin, jnp.ones((N, D)))


def test_wrong_leading_axis_raises() -> None:
  with pytest.raises(ValueError, match='leading axis 3'):
    fsum(jnp.ones((N + 1, D)))
  with pytest.raises(ValueError, match='shape'):
    federated_program(clients=N)(federated_weighted_mean)(jnp.ones((N, D)), jnp.ones(2))


def test_nested_programs() -> None:
  @federated_program(clients=2)
  def inner(x):
    return federated_broadcast(x)

  @federated_program(clients=N)
  def outer(x):
    return federated_broadcast(x), inner(x), federated_broadcast(x)

  a, b, c = outer(jnp.ones(D))
  assert a.shape == (N, D) and b.shape == (2, D) and c.shape == (N, D)


def test_int_mean_is_float() -> None:
  y = jnp.arange(N * 2).reshape(N, 2)
  eager, jitted, abstract = fmean(y), jax.jit(fmean)(y), jax.eval_shape(fmean, y)
  assert eager.dtype == jitted.dtype == abstract.dtype == jnp.float32
  np.testing.assert_allclose(eager, [2.0, 3.0])


@pytest.mark.parametrize('dtype', [jnp.bool_, jnp.int8, jnp.uint8, jnp.int32, jnp.float16])
def test_sum_promotes_like_jnp_sum(dtype) -> None:
  """Bools count instead of OR-ing; three clients of int8 100 sum to 300, not 44."""
  y = jnp.full((N, 2), 100, dtype) if dtype != jnp.bool_ else jnp.ones((N, 2), dtype)
  eager, jitted, abstract = fsum(y), jax.jit(fsum)(y), jax.eval_shape(fsum, y)
  want = jnp.sum(y, axis=0)
  assert eager.dtype == jitted.dtype == abstract.dtype == want.dtype
  np.testing.assert_array_equal(eager, want)
  np.testing.assert_array_equal(jitted, want)
  np.testing.assert_array_equal(eager, np.sum(np.asarray(y).astype(np.int64), axis=0))


def test_int_weighted_mean_cannot_overflow() -> None:
  """int8 values and int8 weights: the mean is taken in float, like `jnp.average`."""
  x, w = jnp.full((N, 2), 100, jnp.int8), jnp.full((N,), 100, jnp.int8)
  got = federated_program(clients=N)(federated_weighted_mean)(x, w)
  assert got.dtype == jnp.average(x, axis=0, weights=w).dtype == jnp.float32
  np.testing.assert_array_equal(got, [100.0, 100.0])
  np.testing.assert_array_equal(fmean(x), [100.0, 100.0])


# Map.


def test_map_single_arg_and_tuple() -> None:
  xs, ys = _rand(0, (N, D)), _rand(1, (N, D))
  run = federated_program(clients=N)(federated_map)
  np.testing.assert_allclose(run(jnp.sin, xs), jnp.sin(xs))
  np.testing.assert_allclose(run(lambda a, b: a * b + 1, (xs, ys)), xs * ys + 1)
  tree = run(lambda t: {'s': t['a'].sum()}, {'a': xs})  # A dict is one argument.
  np.testing.assert_allclose(tree['s'], xs.sum(1), rtol=1e-6)


def test_map_names_the_clients_axis() -> None:
  """Inside `federated_map`, `lax.psum`/`all_gather`/`axis_index` over 'clients' see every
  client (FAX's axis name), eagerly, under jit, and under grad."""
  xs = _rand(0, (N, D))

  @federated_program(clients=N)
  def centred(xs):
    def client(x):
      total = jax.lax.psum(x, 'clients')
      everyone = jax.lax.all_gather(x, 'clients')
      return x - total / N, everyone, jax.lax.axis_index('clients')
    return federated_map(client, xs)

  for run in (centred, jax.jit(centred)):
    out, gathered, index = run(xs)
    np.testing.assert_allclose(out, np.asarray(xs) - np.asarray(xs).mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gathered, np.broadcast_to(xs, (N, N, D)))
    np.testing.assert_array_equal(index, np.arange(N))
  # d/dx_j of sum_i (x_i - mean)·c_i = c_j - mean(c).
  c = _rand(1, (N, D))
  grad = jax.grad(lambda xs: jnp.sum(centred(xs)[0] * c))(xs)
  np.testing.assert_allclose(grad, np.asarray(c) - np.asarray(c).mean(0), rtol=1e-5, atol=1e-6)


# Adjoint identities and Jacobians.


def test_adjoint_broadcast_is_sum() -> None:
  x = {'a': _rand(0, (D,)), 'b': _rand(1, (2, 2))}
  y = {'a': _rand(2, (N, D)), 'b': _rand(3, (N, 2, 2))}
  _, vjp = jax.vjp(broadcast, x)
  (x_bar,) = vjp(y)
  lhs = _vdot(jax.tree.map(lambda v: np.broadcast_to(v, (N, *v.shape)), x), y)
  rhs = _vdot(x, jax.tree.map(lambda v: np.asarray(v).sum(0), y))
  np.testing.assert_allclose(lhs, rhs, rtol=1e-5)
  np.testing.assert_allclose(_vdot(x, x_bar), lhs, rtol=1e-5)
  (y_bar,) = jax.linear_transpose(fsum, y)(x)  # sum^T = broadcast.
  np.testing.assert_allclose(_vdot(y, y_bar), rhs, rtol=1e-5)


def test_adjoint_mean_is_broadcast_over_n() -> None:
  x, y = _rand(0, (D,)), _rand(1, (N, D))
  lhs = _vdot(np.mean(np.asarray(y), 0), x)
  rhs = _vdot(y, np.broadcast_to(x, (N, D))) / N
  np.testing.assert_allclose(lhs, rhs, rtol=1e-5)
  (y_bar,) = jax.linear_transpose(fmean, y)(x)
  np.testing.assert_allclose(_vdot(y, y_bar), lhs, rtol=1e-5)
  _, vjp = jax.vjp(fmean, y)
  np.testing.assert_allclose(vjp(x)[0], np.broadcast_to(x, (N, D)) / N, rtol=1e-6)


@pytest.mark.parametrize(
  'fn, arg_shape, expected',
  [
    (broadcast, (D,), np.broadcast_to(np.eye(D), (N, D, D))),
    (fsum, (N, D), np.broadcast_to(np.eye(D)[:, None], (D, N, D))),
    (fmean, (N, D), np.broadcast_to(np.eye(D)[:, None], (D, N, D)) / N),
    (lambda x: fsum(broadcast(x)), (D,), N * np.eye(D)),
    (lambda x: fmean(broadcast(x)), (D,), np.eye(D)),
  ],
  ids=['broadcast', 'sum', 'mean', 'sum_of_broadcast', 'mean_of_broadcast'],
)
def test_jacobians(fn, arg_shape, expected) -> None:
  x = _rand(0, arg_shape)
  fwd, rev = jax.jacfwd(fn)(x), jax.jacrev(fn)(x)
  np.testing.assert_allclose(fwd, expected, rtol=1e-6)
  np.testing.assert_allclose(rev, fwd, rtol=1e-6)


def test_grad_jaxpr_is_federated() -> None:
  x, y = jnp.ones(D), jnp.ones((N, D))
  assert 'federated_sum' in _jaxpr_primitives(jax.grad(lambda v: broadcast(v).sum()), x)
  assert 'federated_broadcast' in _jaxpr_primitives(jax.grad(lambda v: fsum(v).sum()), y)
  assert 'federated_broadcast' in _jaxpr_primitives(jax.grad(lambda v: fmean(v).sum()), y)
  jvp = jax.linearize(broadcast, x)[1]
  assert 'federated_broadcast' in _jaxpr_primitives(jvp, x)


def test_symbolic_zero_cotangents() -> None:
  aval = jax.core.ShapedArray((N, D), jnp.float32)
  for prim in (primitives.broadcast_p, primitives.sum_p, primitives.mean_p):
    rule = ad.primitive_transposes[prim]
    (ct,) = rule(ad.Zero(aval), ad.UndefinedPrimal(aval), clients=N)
    assert type(ct) is ad.Zero

  @federated_program(clients=N)
  def f(x):  # The federated outputs get zero cotangents / zero tangents.
    unused = federated_mean(federated_broadcast(x))
    stopped = federated_sum(federated_broadcast(jax.lax.stop_gradient(x)))
    return (x**2).sum() + 0.0 * stopped.sum(), unused

  x = _rand(0, (D,))
  g = jax.grad(f, has_aux=True)(x)[0]
  np.testing.assert_allclose(g, 2 * np.asarray(x), rtol=1e-6)
  np.testing.assert_allclose(jax.jacfwd(lambda v: f(v)[0])(x), 2 * np.asarray(x), rtol=1e-6)


# vmap over a whole program.


@federated_program(clients=N)
def _program(x: jax.Array) -> jax.Array:
  clients = federated_broadcast(x)
  scaled = federated_map(lambda a, s: a * s, (clients, jnp.arange(1.0, N + 1)))
  return federated_sum(scaled) + federated_mean(scaled) ** 2


@pytest.mark.parametrize('axis', [0, 1])
def test_vmap_over_program(axis: int) -> None:
  xs = _rand(0, (5, D) if axis == 0 else (D, 5))
  got = jax.vmap(_program, in_axes=axis)(xs)
  one = jax.jit(_program)  # The reference: one program, not one per op.
  want = np.stack([one(np.take(np.asarray(xs), i, axis)) for i in range(5)])
  np.testing.assert_allclose(got, want, rtol=1e-5)
  g = jax.jit(jax.vmap(jax.grad(lambda x: _program(x).sum()), in_axes=axis))(xs)
  assert g.shape == (5, D)


@pytest.mark.parametrize('axis', [0, 1, 2])
def test_vmap_reductions_any_batch_axis(axis: int) -> None:
  ys = _rand(0, (5, N, D))
  moved = jnp.moveaxis(ys, 0, axis)
  want_sum, want_mean = np.asarray(ys).sum(1), np.asarray(ys).mean(1)
  np.testing.assert_allclose(jax.vmap(fsum, in_axes=axis)(moved), want_sum, rtol=1e-6)
  np.testing.assert_allclose(jax.vmap(fmean, in_axes=axis)(moved), want_mean, rtol=1e-6)
  jitted = jax.jit(jax.vmap(fmean, in_axes=axis))(moved)
  np.testing.assert_allclose(jitted, want_mean, rtol=1e-6)


# Weighted mean.

wmean = federated_program(clients=N)(federated_weighted_mean)


def test_weighted_mean_constant_weights_is_mean() -> None:
  x = {'a': _rand(0, (N, D)), 'b': _rand(1, (N,))}
  got = wmean(x, 2.5 * jnp.ones(N))
  want = fmean(x)
  for key in x:
    np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)


def test_weighted_mean_gradients() -> None:
  x, w = _rand(0, (N, D)), jnp.array([1.0, 2.0, 5.0])
  f = lambda x, w: wmean(x, w).sum()
  gx, gw = jax.grad(f, argnums=(0, 1))(x, w)
  w_np = np.asarray(w)
  np.testing.assert_allclose(gx, np.broadcast_to((w_np / w_np.sum())[:, None], (N, D)), rtol=1e-6)
  # f = sum_i w_i s_i / W with s_i = sum(x_i), so df/dw_j = (s_j - f) / W.
  s = np.asarray(x).sum(1)
  np.testing.assert_allclose(gw, (s - np.asarray(f(x, w))) / w_np.sum(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(jax.jacfwd(f, argnums=1)(x, w), gw, rtol=1e-5, atol=1e-6)


# FedSGD: the gradient of the mean client loss is the mean of client gradients.


def _loss(params: dict, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
  inputs, targets = batch
  return jnp.mean((inputs @ params['w'] + params['b'] - targets) ** 2)


def test_fedsgd_step_matches_hand_computation() -> None:
  params = {'w': _rand(0, (D,)), 'b': jnp.float32(0.3)}
  inputs, targets = _rand(1, (N, 8, D)), _rand(2, (N, 8))
  lr = 0.1

  @federated_program(clients=N)
  def mean_client_loss(params, inputs, targets):
    losses = federated_map(_loss, (federated_broadcast(params), (inputs, targets)))
    return federated_mean(losses)

  grads = jax.jit(jax.grad(mean_client_loss))(params, inputs, targets)
  params, grads, inputs, targets = jax.tree.map(np.asarray, (params, grads, inputs, targets))
  step = jax.tree.map(lambda p, g: p - lr * g, params, grads)

  # By hand (numpy): d/dw mean((Xw + b - y)^2) = 2 X^T r / B and d/db = 2 mean(r), per client.
  residual = np.einsum('nbd,d->nb', inputs, params['w']) + params['b'] - targets
  grad_w = np.mean(2 * np.einsum('nbd,nb->nd', inputs, residual) / 8, axis=0)
  grad_b = np.mean(2 * np.mean(residual, axis=1))
  np.testing.assert_allclose(step['w'], params['w'] - lr * grad_w, rtol=1e-5)
  np.testing.assert_allclose(step['b'], params['b'] - lr * grad_b, rtol=1e-5)


# Sharding on an 8-device CPU mesh, in a subprocess (the suite itself has 1 device).

_MESH_SCRIPT = textwrap.dedent(
  """
  import json, warnings
  import jax, jax.numpy as jnp
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
  from paxlike.federated import (federated_broadcast, federated_map,
                                 federated_mean, federated_program)

  warnings.simplefilter("ignore", DeprecationWarning)  # Legacy `with mesh:`.
  assert jax.device_count() == 8, jax.devices()

  @federated_program(clients=2)
  def program(x, inner):
    clients = federated_broadcast(x)
    per_client = lambda a: jnp.tanh(a) if inner is None else (
      jax.lax.with_sharding_constraint(jnp.tanh(a), inner))
    mapped = federated_map(per_client, clients)
    return clients, mapped, federated_mean(mapped)

  def loss(x):
    return program(x, None)[2].sum() ** 2

  x = jnp.arange(32.0).reshape(8, 4) / 32
  reference = jax.jit(jax.grad(loss))(x)  # No mesh at all.
  results = {}
  for names, shape, inner in [
    (("clients", "data"), (2, 4), P("data")),
    (("clients", "data", "model"), (2, 2, 2), P("data", "model")),
    (("data",), (8,), P("data")),
  ]:
    mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names))
    for context in ("set_mesh", "legacy"):
      with jax.set_mesh(mesh) if context == "set_mesh" else mesh:
        outs = jax.jit(program, static_argnums=1)(x, inner)
        presharded = jax.device_put(x, NamedSharding(mesh, P("data")))
        kept = jax.jit(program, static_argnums=1)(presharded, None)[0]
        grad = jax.jit(jax.grad(loss))(x)
      results["/".join(names) + ":" + context] = {
        "specs": [list(o.sharding.spec) for o in outs],
        "kept": list(kept.sharding.spec),
        "mean_ok": bool(jnp.allclose(outs[2], jnp.tanh(x))),
        "grad_ok": bool(jnp.allclose(grad, reference, rtol=1e-5)),
      }
  print("RESULTS=" + json.dumps(results))
  """
)


@pytest.fixture(scope='module')
def mesh_results() -> dict:
  stdout = run_script(_MESH_SCRIPT)
  line = next(l for l in stdout.splitlines() if l.startswith('RESULTS='))
  return json.loads(line.removeprefix('RESULTS='))


@pytest.mark.parametrize('context', ['set_mesh', 'legacy'])
@pytest.mark.parametrize(
  'mesh, inner',
  [('clients/data', ['data']), ('clients/data/model', ['data', 'model'])],
)
def test_sharding_on_clients_mesh(mesh_results, mesh, context, inner) -> None:
  r = mesh_results[f'{mesh}:{context}']
  broadcast_spec, map_spec, mean_spec = r['specs']
  assert broadcast_spec[0] == 'clients' and map_spec == ['clients', *inner]
  assert mean_spec == inner  # Server value keeps the per-client sharding.
  assert r['kept'] == ['clients', 'data']  # Inner dims keep the input's sharding.
  assert r['mean_ok'] and r['grad_ok']


@pytest.mark.parametrize('context', ['set_mesh', 'legacy'])
def test_no_clients_axis_forces_nothing(mesh_results, context) -> None:
  r = mesh_results[f'data:{context}']
  assert all('clients' not in spec for spec in r['specs'])
  assert r['specs'][0][:1] in ([], [None])  # Leading (clients) axis not sharded.
  assert r['mean_ok'] and r['grad_ok']
