"""Federated primitives in the style of FAX (arXiv 2403.07128).

A federated program runs on a fixed number of clients, set by
`federated_program(clients=N)`. A clients-placed value is a pytree whose leaves
have a leading axis of size N; a server-placed value is an ordinary pytree.

`federated_broadcast`, `federated_sum` and `federated_mean` are real JAX
primitives (`federated_broadcast`, `federated_sum`, `federated_mean`) with
abstract eval, lowering, batching, JVP and transpose rules. Broadcast and sum
are each other's transpose, so `jax.grad` of a federated program is again a
federated program. `federated_map` is a `vmap` over clients (axis name 'clients') and
`federated_weighted_mean` is built from map and sum.

When the ambient mesh (`jax.set_mesh(mesh)` or the legacy `with mesh:`) has an
Auto axis named `clients`, clients-placed values are sharded along it; inner
dimensions are left unconstrained so per-client sharding keeps working.
"""

from __future__ import annotations

import contextvars
import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import mesh as _mesh_lib  # Only for the legacy `with mesh:` context.
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from paxlike.core.partitioning import CLIENTS_AXIS

PyTree = Any
F = TypeVar('F', bound=Callable[..., Any])

_CLIENTS: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    'federated_clients', default=None)
# This program's broadcasts: id(client-placed leaf) -> (that leaf, the server value it copies).
_BROADCASTS: contextvars.ContextVar[dict[int, tuple[Any, Any]] | None] = contextvars.ContextVar(
    'federated_broadcasts', default=None)


# Placement.


def federated_program(clients: int) -> Callable[[F], F]:
  """Decorator: runs the function with `clients` clients (programs may nest)."""
  if not isinstance(clients, int) or clients < 1:
    raise ValueError(f'clients must be a positive int, got {clients!r}')

  def decorator(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
      token, broadcasts = _CLIENTS.set(clients), _BROADCASTS.set({})
      try:
        return fn(*args, **kwargs)
      finally:
        _BROADCASTS.reset(broadcasts)
        _CLIENTS.reset(token)

    return wrapper  # type: ignore[return-value]

  return decorator


def _num_clients(op: str) -> int:
  clients = _CLIENTS.get()
  if clients is None:
    raise RuntimeError(f'{op} called outside a federated program; wrap the calling function '
                       'in @federated_program(clients=N).')
  return clients


def _check_clients_placed(tree: PyTree, clients: int, op: str) -> None:
  for leaf in jax.tree.leaves(tree):
    shape = jnp.shape(leaf)
    if not shape or shape[0] != clients:
      raise ValueError(f'{op} expects clients-placed leaves with leading axis {clients}, '
                       f'got shape {shape}.')


# Sharding.


def _clients_mesh_active() -> bool:
  """Whether the ambient mesh has an Auto axis named `clients`."""
  mesh = jax.sharding.get_abstract_mesh()  # Set by jax.set_mesh, also under jit.
  legacy = getattr(_mesh_lib, 'thread_resources', None)  # Legacy `with mesh:`.
  if mesh.empty and legacy is not None:
    mesh = legacy.env.physical_mesh
  if mesh.empty:
    return False
  axis_types = dict(zip(mesh.axis_names, mesh.axis_types))
  return axis_types.get(CLIENTS_AXIS) == AxisType.Auto


def _constrain_clients(tree: PyTree) -> PyTree:
  """Shards the leading axis of every leaf over `clients`, if the mesh has it."""
  if not _clients_mesh_active():
    return tree

  def constrain(leaf: jax.Array) -> jax.Array:
    spec = P(CLIENTS_AXIS, *[P.UNCONSTRAINED] * (leaf.ndim - 1))
    return jax.lax.with_sharding_constraint(leaf, spec)

  return jax.tree.map(constrain, tree)


# The primitives.

broadcast_p = Primitive('federated_broadcast')
sum_p = Primitive('federated_sum')
mean_p = Primitive('federated_mean')


def _sum_dtype(dtype: Any) -> Any:
  """`jnp.sum`'s result dtype: bools and narrow ints widen to the default (u)int, so that
  summing many clients neither ORs bools nor overflows int8."""
  if dtype != np.bool_ and not jnp.issubdtype(dtype, np.integer):
    return dtype  # Floats, complex, and float0 tangents.
  wide = jnp.uint64 if jnp.issubdtype(dtype, np.unsignedinteger) else jnp.int64
  return np.promote_types(dtype, jax.dtypes.canonicalize_dtype(wide))  # 32 bits unless x64.


def _mean_dtype(dtype: Any) -> Any:
  """`jnp.mean`'s result dtype: floats keep theirs, the rest is the default float."""
  if jnp.issubdtype(dtype, jnp.inexact):
    return dtype
  return jax.dtypes.canonicalize_dtype(jnp.float64)  # float32 unless x64.


def _broadcast_impl(x: jax.Array, *, clients: int) -> jax.Array:
  return jnp.broadcast_to(x, (clients, *x.shape))


def _sum_impl(x: jax.Array, *, clients: int) -> jax.Array:
  del clients
  return jnp.sum(x, axis=0, dtype=_sum_dtype(x.dtype))


def _mean_impl(x: jax.Array, *, clients: int) -> jax.Array:
  del clients
  return jnp.mean(x.astype(_mean_dtype(x.dtype)), axis=0)


def _with_spec(aval: Any, spec: P) -> NamedSharding:
  return NamedSharding(aval.sharding.mesh, spec)


def _broadcast_abstract(x: Any, *, clients: int) -> Any:
  spec = P(None, *x.sharding.spec)
  return x.update(shape=(clients, *x.shape), sharding=_with_spec(x, spec))


def _reduce_abstract(x: Any, dtype: Any) -> Any:
  if x.ndim == 0:
    raise ValueError('federated reductions need a leading clients axis.')
  spec = P(*x.sharding.spec[1:])
  weak_type = x.weak_type if dtype == x.dtype else False
  return x.update(shape=x.shape[1:], dtype=dtype, weak_type=weak_type,
                  sharding=_with_spec(x, spec))


def _sum_abstract(x: Any, *, clients: int) -> Any:
  del clients
  return _reduce_abstract(x, _sum_dtype(x.dtype))


def _mean_abstract(x: Any, *, clients: int) -> Any:
  del clients
  return _reduce_abstract(x, _mean_dtype(x.dtype))


def _linear_jvp(prim: Primitive) -> Callable[..., tuple[Any, Any]]:
  def jvp(primals: tuple[Any], tangents: tuple[Any], **params: Any):
    (x,), (t,) = primals, tangents
    out = prim.bind(x, **params)
    if type(t) is ad.Zero:
      return out, ad.Zero(out.aval.to_tangent_aval())
    return out, prim.bind(t, **params)

  return jvp


def _transpose(rule: Callable[[jax.Array, int], jax.Array]) -> Callable[..., list[Any]]:
  def transpose(ct: Any, x: Any, *, clients: int) -> list[Any]:
    if type(ct) is ad.Zero:
      return [ad.Zero(x.aval.to_tangent_aval())]
    return [rule(ct, clients)]

  return transpose


def _broadcast_batch(args: Any, dims: Any, *, clients: int) -> tuple[Any, int]:
  (x,), (d,) = args, dims
  return broadcast_p.bind(x, clients=clients), d + 1  # New axis goes in front.


def _reduce_batch(prim: Primitive) -> Callable[..., tuple[Any, int]]:
  def batch(args: Any, dims: Any, *, clients: int) -> tuple[Any, int]:
    (x,), (d,) = args, dims
    x = jnp.moveaxis(x, d, 1)  # Clients axis at 0, batch axis at 1.
    return prim.bind(x, clients=clients), 0

  return batch


for _prim, _impl, _abstract in ((broadcast_p, _broadcast_impl, _broadcast_abstract),
                                (sum_p, _sum_impl, _sum_abstract),
                                (mean_p, _mean_impl, _mean_abstract)):
  _prim.def_impl(_impl)
  _prim.def_abstract_eval(_abstract)
  mlir.register_lowering(_prim, mlir.lower_fun(_impl, multiple_results=False))
  ad.primitive_jvps[_prim] = _linear_jvp(_prim)

batching.primitive_batchers[broadcast_p] = _broadcast_batch
batching.primitive_batchers[sum_p] = _reduce_batch(sum_p)
batching.primitive_batchers[mean_p] = _reduce_batch(mean_p)
ad.primitive_transposes[broadcast_p] = _transpose(lambda ct, n: sum_p.bind(ct, clients=n))
ad.primitive_transposes[sum_p] = _transpose(lambda ct, n: broadcast_p.bind(ct, clients=n))
ad.primitive_transposes[mean_p] = _transpose(lambda ct, n: broadcast_p.bind(ct, clients=n) / n)


# Public operations.


def federated_broadcast(x: PyTree) -> PyTree:
  """Server → clients: adds a leading axis of size N to every leaf."""
  clients = _num_clients('federated_broadcast')
  server = jax.tree.map(jnp.asarray, x)
  out = _constrain_clients(jax.tree.map(lambda v: broadcast_p.bind(v, clients=clients), server))
  table = _BROADCASTS.get()
  if table is not None:
    table.update((id(o), (o, v)) for o, v in zip(jax.tree.leaves(out), jax.tree.leaves(server)))
  return out


def federated_sum(x: PyTree) -> PyTree:
  """Clients → server: sums over the leading clients axis, promoting like `jnp.sum` (bools and
  narrow ints to the default int)."""
  clients = _num_clients('federated_sum')
  _check_clients_placed(x, clients, 'federated_sum')
  return jax.tree.map(lambda v: sum_p.bind(jnp.asarray(v), clients=clients), x)


def federated_mean(x: PyTree) -> PyTree:
  """Clients → server: averages over the leading clients axis (always float)."""
  clients = _num_clients('federated_mean')
  _check_clients_placed(x, clients, 'federated_mean')
  return jax.tree.map(lambda v: mean_p.bind(jnp.asarray(v), clients=clients), x)


def federated_map(fn: Callable[..., PyTree], arg: PyTree, chunk: int | None = None) -> PyTree:
  """Applies `fn` per client; a tuple `arg` is unpacked into fn's arguments.

  All clients at once (`vmap`) by default, with the clients axis named 'clients' inside `fn`
  (as in FAX), so that `fn` can reduce or gather across clients: `lax.psum(v, 'clients')`,
  `lax.all_gather(v, 'clients')`, `lax.axis_index('clients')`. With `chunk=k`, `k` clients at a time
  (`lax.map(batch_size=k)`: vmap inside a chunk, a loop over chunks): the same result with
  1/(clients/k) of the activation memory, and on CPU often faster (smaller operands stay in
  cache). Chunks run one after another, so collectives over 'clients' are unavailable there,
  and with a sharded `clients` mesh axis keep the default. A chunked map reads an argument that
  is this program's `federated_broadcast` output as the server value it copies, so the N
  copies are never made (the loop over chunks would have to hold them all).
  """
  clients = _num_clients('federated_map')
  args = arg if isinstance(arg, tuple) else (arg,)
  _check_clients_placed(args, clients, 'federated_map')
  if chunk is not None and (not isinstance(chunk, int) or chunk < 1):
    raise ValueError(f'chunk must be a positive int or None, got {chunk!r}.')
  args = _constrain_clients(args)
  if chunk is None or chunk >= clients:
    spmd_axis = CLIENTS_AXIS if _clients_mesh_active() else None
    out = jax.vmap(fn, axis_name=CLIENTS_AXIS, spmd_axis_name=spmd_axis)(*args)
  else:
    if _clients_mesh_active():
      warnings.warn(f"federated_map(chunk={chunk}) over a sharded 'clients' mesh axis runs the "
                    'chunks one after another, gathering each; use chunk=None there.',
                    stacklevel=2)
    out = _chunked_map(fn, args, chunk)
  return _constrain_clients(out)


def _chunked_map(fn: Callable[..., PyTree], args: tuple, chunk: int) -> PyTree:
  """`lax.map(batch_size=chunk)` of `fn` over the leaves of `args` that are not broadcasts;
  a broadcast leaf enters every client's call as its server value."""
  leaves, tree = jax.tree.flatten(args)
  table = _BROADCASTS.get() or {}
  server = [table[id(x)][1] if id(x) in table and table[id(x)][0] is x else None for x in leaves]
  mapped = [x for x, s in zip(leaves, server) if s is None]
  if not mapped:  # lax.map needs one mapped leaf to count the clients by.
    return jax.lax.map(lambda a: fn(*a), args, batch_size=chunk)

  def one(mapped_leaves: list[Any]) -> PyTree:
    rest = iter(mapped_leaves)
    return fn(*jax.tree.unflatten(tree, [next(rest) if s is None else s for s in server]))

  return jax.lax.map(one, mapped, batch_size=chunk)


def federated_weighted_sums(x: PyTree, w: jax.Array, name: str = 'federated_weighted_sums'
                            ) -> tuple[PyTree, jax.Array]:
  """Clients → server: (sum_i w_i x_i, sum_i w_i), with `w` of shape [N], in the weighted
  mean's float dtype (ints are converted before they are weighted, so they cannot overflow):
  `federated_weighted_mean` divides them; a caller that guards an all-zero sum of weights
  divides them itself."""
  clients = _num_clients(name)
  w = jnp.asarray(w)
  if w.shape != (clients,):
    raise ValueError(f'weights must have shape ({clients},), got {w.shape}.')
  w = w.astype(_mean_dtype(w.dtype))

  def weigh(xi, wi):  # In the mean's dtype (like jnp.average).
    return jax.tree.map(lambda v: v.astype(_mean_dtype(jnp.result_type(v, wi))) * wi, xi)

  return federated_sum(federated_map(weigh, (x, w))), federated_sum(w)


def federated_weighted_mean(x: PyTree, w: jax.Array) -> PyTree:
  """Clients → server: sum_i w_i x_i / sum_i w_i, with `w` of shape [N]; always float, like
  `jnp.average` (ints are converted before they are weighted)."""
  sums, total = federated_weighted_sums(x, w, 'federated_weighted_mean')
  return jax.tree.map(lambda s: s / total, sums)
