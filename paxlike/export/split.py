"""A federated program's jaxpr split into the programs a federated runtime runs.

Placements come from the federated primitives alone, forward over the jaxpr of the round:

- the client-placed inputs (batches, weights, client state) are `clients`;
- a `federated_broadcast` output is `uniform` (placed at the clients, the same at each), and so
  is anything computed from uniform, server and constant values only (e.g. the 1/N that the
  transpose of `federated_mean` applies to a broadcast cotangent);
- an equation with a `clients` operand is `clients` (what `federated_map`'s vmap leaves), and
  so is one reading a server value that has a clients axis (per-client rngs split on the
  server: each client takes its row and carries on);
- `federated_sum` / `federated_mean` take a `clients` operand to a server value (`after`);
- everything else is `server`, or `const` when it depends on no input.

That gives one communication round, the only shape supported:

  server_pre   server inputs → the values sent down (broadcast whole, or scattered by row)
  client       one client's values → its contribution to each aggregation, its new state
  server_post  server inputs and the aggregates → the server outputs

A broadcast of a value computed from an aggregate (a second round trip), a federated primitive
inside a control-flow body (PAPA's `lax.cond` averaging), a client value reduced across clients
by an ordinary op, or client code whose constants depend on the cohort size is refused with a
one-line `ExportError`.

Three traces of the same computation: at the round's N clients (the plan and the server
programs), at N + 1 (where the clients axis of every value is the axis that changed, and the
client equations' constants must not have), and at one client (the client program: a function
mapped over clients cannot see how many there are). The one-client trace is aligned with the
N-client one equation by equation (size-1 axes take a few different paths through jax.numpy);
every value crossing the client boundary must be found in both with matching shapes.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core

from paxlike.errors import UserError
from paxlike.federated.primitives import broadcast_p, mean_p, sum_p

AGGREGATIONS = {sum_p: 'sum', mean_p: 'mean'}
FEDERATED = (broadcast_p, sum_p, mean_p)


class ExportError(UserError):
  """A round this exporter cannot split faithfully (exit code 2, one line)."""


@dataclasses.dataclass(frozen=True)
class Program:
  """`fn(*inputs) -> outputs` on flat arrays (PRNG keys as key data), with their names."""

  fn: Callable[..., list[jax.Array]]
  inputs: list[str]
  outputs: list[str]
  in_avals: list[jax.ShapeDtypeStruct]


@dataclasses.dataclass(frozen=True)
class Split:
  """The three programs and the communication between them, in the order of the jaxpr."""

  server_pre: Program
  client: Program
  server_post: Program
  communication: list[dict[str, Any]]  # {'kind', 'value', ...}: see docs/export.md.
  clients: int


def _is_var(atom: Any) -> bool:
  return isinstance(atom, core.Var)


def _sub_jaxprs(eqn: core.JaxprEqn) -> list[core.Jaxpr]:
  """Every jaxpr nested in `eqn`'s params, depth first."""
  found, stack = [], list(core.jaxprs_in_params(eqn.params))
  while stack:
    jaxpr = stack.pop(0)
    found.append(jaxpr)
    stack[:0] = [j for e in jaxpr.eqns for j in core.jaxprs_in_params(e.params)]
  return found


def _literals(eqn: core.JaxprEqn) -> list[Any]:
  """The literal operands of `eqn` and of every equation nested in it, in order."""
  eqns = [eqn, *(e for j in _sub_jaxprs(eqn) for e in j.eqns)]
  return [np.asarray(a.val) for e in eqns for a in e.invars if isinstance(a, core.Literal)]


def _same_structure(a: core.Jaxpr, b: core.Jaxpr) -> bool:
  return (len(a.invars) == len(b.invars) and len(a.outvars) == len(b.outvars)
          and len(a.constvars) == len(b.constvars) and len(a.eqns) == len(b.eqns)
          and all(x.primitive is y.primitive and len(x.outvars) == len(y.outvars)
                  for x, y in zip(a.eqns, b.eqns)))


def _var_map(a: core.Jaxpr, b: core.Jaxpr, pairs: Sequence[tuple[int, int]]) -> dict:
  """Vars of `a` to vars of `b`: inputs, constants, and the outputs of paired equations."""
  mapping = dict(zip(a.invars, b.invars))
  if len(a.constvars) == len(b.constvars):
    mapping.update(zip(a.constvars, b.constvars))
  for i, j in pairs:
    mapping.update(zip(a.eqns[i].outvars, b.eqns[j].outvars))
  return mapping


def _aligned(a: core.Jaxpr, b: core.Jaxpr) -> list[tuple[int, int]]:
  """Index pairs of equations of `a` and `b` that line up (same primitive, in order)."""
  key = lambda e: (e.primitive.name, len(e.outvars), len(e.invars))
  matcher = difflib.SequenceMatcher(None, [key(e) for e in a.eqns], [key(e) for e in b.eqns],
                                    autojunk=False)
  return [(m.a + k, m.b + k) for m in matcher.get_matching_blocks() for k in range(m.size)]


def _clients_axis(many: Any, more: Any) -> int | None | str:
  """The one axis where avals `many` (N clients) and `more` (N + 1) differ; None if none,
  'bad' if several or another difference."""
  if many.ndim != more.ndim or many.dtype != more.dtype:
    return 'bad'
  axes = [d for d, (m, o) in enumerate(zip(many.shape, more.shape)) if m != o]
  if len(axes) > 1 or any(more.shape[d] != many.shape[d] + 1 for d in axes):
    return 'bad'
  return axes[0] if axes else None


def _placements(jaxpr: core.Jaxpr, in_places: Sequence[str],
                axis: Callable[[core.Var], int | None]) -> dict[core.Var, str]:
  """'const', 'server', 'uniform', 'clients' or 'after' for every var (see the module doc)."""
  place: dict[core.Var, str] = {v: 'const' for v in jaxpr.constvars}
  place.update(zip(jaxpr.invars, in_places))
  for index, eqn in enumerate(jaxpr.eqns):
    where = f'equation {index} ({eqn.primitive.name})'
    if any(e.primitive in FEDERATED for j in _sub_jaxprs(eqn) for e in j.eqns):
      raise ExportError(f'{where} has federated primitives inside its body (e.g. averaging '
                        'under lax.cond): only one broadcast → clients → aggregation round '
                        'at the top level can be split')
    kinds = {place[a] if _is_var(a) else 'const' for a in eqn.invars}
    scattered = any(_is_var(a) and place[a] == 'server' and axis(a) is not None
                    for a in eqn.invars)
    if 'after' in kinds and (eqn.primitive in FEDERATED or kinds & {'clients', 'uniform'}
                             or scattered):
      raise ExportError(f'{where} sends a value computed from an aggregate back to the '
                        'clients: the round has two communication rounds')
    if eqn.primitive is broadcast_p:
      if kinds & {'clients', 'uniform'}:
        raise ExportError(f'{where} broadcasts a value that is already at the clients')
      out = 'uniform'
    elif eqn.primitive in AGGREGATIONS:
      out = 'after'  # Of any value with a clients axis: constants too (a client learning rate).
    elif 'clients' in kinds or scattered:
      out = 'clients'
    else:
      out = next(k for k in ('uniform', 'after', 'server', 'const') if k in kinds | {'const'})
    place.update((v, out) for v in eqn.outvars)
  return place


def _constants(jaxpr: core.Jaxpr) -> set[core.Var]:
  """Vars that depend on no input."""
  const = set(jaxpr.constvars)
  for eqn in jaxpr.eqns:
    if all(not _is_var(a) or a in const for a in eqn.invars):
      const.update(eqn.outvars)
  return const


def _backward_slice(jaxpr: core.Jaxpr, outputs: Sequence[Any], inputs: set,
                    program: str) -> list[core.JaxprEqn]:
  """The equations `outputs` need from `inputs` (and constants); refuses any other need."""
  const = _constants(jaxpr)
  needed = {v for v in outputs if _is_var(v) and v not in inputs}
  chosen = []
  for eqn in reversed(jaxpr.eqns):
    if any(v in needed for v in eqn.outvars):
      chosen.append(eqn)
      needed.difference_update(eqn.outvars)
      needed.update(v for v in eqn.invars if _is_var(v) and v not in inputs)
  if needed - const:
    raise ExportError(f'the {program} program needs a value from another placement without '
                      f'a federated primitive in between ({sorted(map(str, needed - const))[0]})')
  return chosen[::-1]


def _key_codec(aval: Any, impl: str) -> tuple[Callable, Callable, jax.ShapeDtypeStruct]:
  """(decode, encode, boundary aval): typed PRNG keys cross programs as uint32 key data."""
  if not jnp.issubdtype(aval.dtype, jax.dtypes.prng_key):
    return _identity, _identity, jax.ShapeDtypeStruct(aval.shape, aval.dtype)
  data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(aval.shape, aval.dtype))
  return (lambda x: jax.random.wrap_key_data(x, impl=impl), jax.random.key_data,
          jax.ShapeDtypeStruct(data.shape, data.dtype))


def _identity(x: Any) -> Any:
  return x


def _program(closed: core.ClosedJaxpr, eqns: list, inputs: list[tuple], outputs: list[tuple],
             key_impl: str) -> Program:
  """A flat program from `(var, name, axis)` inputs to `(atom, name, axis)` outputs.

  An input with an axis arrives without it (one client's row) and gets it back as size 1; an
  output with an axis leaves as its row 0 along it. PRNG keys cross as key data.
  """
  names = closed.jaxpr.debug_info._replace(arg_names=tuple(n for _, n, _ in inputs),
                                           result_paths=tuple(n for _, n, _ in outputs))
  jaxpr = core.Jaxpr(closed.jaxpr.constvars, [v for v, _, _ in inputs],
                     [v for v, _, _ in outputs], eqns,
                     frozenset().union(*(e.effects for e in eqns)), debug_info=names)
  run = core.jaxpr_as_fun(core.ClosedJaxpr(jaxpr, closed.consts))
  decode = [_key_codec(v.aval, key_impl)[0] for v, _, _ in inputs]
  encode = [_key_codec(v.aval, key_impl)[1] if _is_var(v) else _identity for v, _, _ in outputs]

  def fn(*args):
    args = [d(x if axis is None else jnp.expand_dims(x, axis))
            for d, x, (_, _, axis) in zip(decode, args, inputs)]
    outs = run(*args)
    return [e(y if axis is None else jnp.take(y, 0, axis=axis))
            for e, y, (_, _, axis) in zip(encode, outs, outputs)]

  avals = []
  for v, _, axis in inputs:
    shape = v.aval.shape if axis is None else v.aval.shape[:axis] + v.aval.shape[axis + 1:]
    avals.append(_key_codec(jax.ShapeDtypeStruct(shape, v.aval.dtype), key_impl)[2])
  return Program(fn, [n for _, n, _ in inputs], [n for _, n, _ in outputs], avals)


def _specs(args: Any, placed: Sequence[bool], clients: int) -> Any:
  """`args` as ShapeDtypeStructs with `clients` on the leading axis of client-placed leaves."""
  leaves, treedef = jax.tree.flatten(args)
  specs = [jax.ShapeDtypeStruct((clients, *jnp.shape(x)[1:]) if p else jnp.shape(x),
                                x.dtype if hasattr(x, 'dtype') else jnp.result_type(x),
                                weak_type=getattr(x, 'weak_type', False))
           for x, p in zip(leaves, placed)]
  return jax.tree.unflatten(treedef, specs)


def split(fn_at: Callable[[int], Callable], args: Sequence[Any], client_placed: Sequence[Any],
          in_names: list[str], out_names: list[str], key_impl: str = 'threefry2x32') -> Split:
  """Splits `fn_at(N)(*args)` into server_pre, client and server_post programs.

  `fn_at(n)`: the computation for a cohort of n (e.g. the algorithm rebuilt with n replicas;
  `lambda n: fn` when `fn` reads the cohort off its inputs). `client_placed`: a tree of bools
  like `args`, True where the leaf has a leading clients axis. `in_names`/`out_names`: one
  name per flat input and output leaf.
  """
  placed = jax.tree.leaves(client_placed)
  sizes = {jnp.shape(x)[0] for x, p in zip(jax.tree.leaves(args), placed) if p}
  if len(sizes) != 1:
    raise ExportError(f'client-placed inputs need one common leading axis, got {sizes}')
  n = sizes.pop()
  closed = jax.make_jaxpr(fn_at(n))(*_specs(args, placed, n))
  more = jax.make_jaxpr(fn_at(n + 1))(*_specs(args, placed, n + 1)).jaxpr
  closed_one = jax.make_jaxpr(fn_at(1))(*_specs(args, placed, 1))
  jaxpr, one = closed.jaxpr, closed_one.jaxpr
  if len(in_names) != len(jaxpr.invars) or len(out_names) != len(jaxpr.outvars):
    raise ExportError("the names do not match the program's flat inputs and outputs")
  if not _same_structure(jaxpr, more):
    raise ExportError(f'the round runs different equations for {n} and {n + 1} clients')
  to_more = _var_map(jaxpr, more, [(i, i) for i in range(len(jaxpr.eqns))])
  axis = {v: _clients_axis(v.aval, to_more[v].aval) for v in to_more}
  place = _placements(jaxpr, ['clients' if p else 'server' for p in placed],
                      lambda v: axis.get(v) if axis.get(v) != 'bad' else None)
  for v, p in place.items():
    if p in ('clients', 'uniform') and not isinstance(axis.get(v), int):
      raise ExportError(f'value {v} ({v.aval.str_short()}) is at the clients but has no single '
                        'clients axis: it was computed across clients without a federated '
                        'primitive')
  for e, m in zip(jaxpr.eqns, more.eqns):
    a, b = _literals(e), _literals(m)
    if place[e.outvars[0]] == 'clients' and (
        len(a) != len(b) or not all(np.array_equal(x, y) for x, y in zip(a, b))):
      raise ExportError(f'the client computation ({e.primitive.name}) uses a constant that '
                        'depends on the number of clients, so it differs per cohort size')

  names = dict(zip(jaxpr.invars, in_names))
  communication: list[dict[str, Any]] = []
  pre_out: list[tuple] = []     # (N-trace atom, name, row axis) the server sends.
  client_in: list[tuple] = []   # (N-trace var, name, clients axis) each client receives.
  sent: set[core.Var] = set()
  producer = {v: e for e in jaxpr.eqns for v in e.outvars}
  client_eqns = [e for e in jaxpr.eqns if place[e.outvars[0]] == 'clients']
  used = {a for e in jaxpr.eqns for a in e.invars if _is_var(a)}
  used |= {a for a in jaxpr.outvars if _is_var(a)}
  aggregated = [e.invars[0] for e in jaxpr.eqns if e.primitive in AGGREGATIONS
                and e.outvars[0] in used]
  for v in [*(a for e in client_eqns for a in e.invars), *aggregated]:
    if not _is_var(v) or v in sent or place[v] not in ('uniform', 'server'):
      continue
    sent.add(v)
    name = f'down.{len(pre_out)}'
    if place[v] == 'uniform' and producer.get(v, None) is not None \
        and producer[v].primitive is broadcast_p:
      pre_out.append((producer[v].invars[0], name, None))  # Send what was broadcast.
      communication.append({'kind': 'broadcast', 'value': name})
    elif place[v] == 'uniform':  # Computed from broadcasts: every row is the same.
      pre_out.append((v, name, axis[v]))
      communication.append({'kind': 'broadcast', 'value': name})
    elif axis[v] is not None:
      pre_out.append((v, name, None))
      communication.append({'kind': 'scatter', 'value': name, 'axis': axis[v]})
    else:
      pre_out.append((v, name, None))
      communication.append({'kind': 'broadcast', 'value': name})
    client_in.append((v, name, axis[v]))
  client_in += [(v, names[v], 0) for v in jaxpr.invars if place[v] == 'clients']

  client_out: list[tuple] = []  # (N-trace var, name)
  up: dict[core.Var, str] = {}
  aggregates: list[tuple] = []  # (N-trace result var, name)
  for eqn in jaxpr.eqns:
    if eqn.primitive in AGGREGATIONS and eqn.outvars[0] in used:  # Skip unused (dead) ones.
      src = eqn.invars[0]
      if src not in up:
        up[src] = f'up.{len(up)}'
        client_out.append((src, up[src]))
      result = f'agg.{len(aggregates)}'
      aggregates.append((eqn.outvars[0], result))
      communication.append({'kind': AGGREGATIONS[eqn.primitive], 'value': up[src],
                            'result': result, **({'of': names[src]} if src in names else {})})
  server_out = []
  for v, name in zip(jaxpr.outvars, out_names):
    where = place[v] if _is_var(v) else 'const'
    if where == 'clients':
      if axis[v] != 0:
        raise ExportError(f'output {name} is at the clients but not along its leading axis')
      client_out.append((v, name))
    elif where == 'uniform':
      raise ExportError(f'output {name} is a broadcast value; return it before broadcasting')
    else:
      server_out.append((v, name, None))

  server_in = [(v, names[v], None) for v in jaxpr.invars if place[v] == 'server']
  pre_eqns = _backward_slice(jaxpr, [a for a, _, _ in pre_out], {v for v, _, _ in server_in},
                             'server_pre')
  server_pre = _program(closed, pre_eqns, _used(server_in, pre_eqns, pre_out), pre_out,
                        key_impl)
  post_in = server_in + [(v, name, None) for v, name in aggregates]
  post_eqns = _backward_slice(jaxpr, [a for a, _, _ in server_out], {v for v, _, _ in post_in},
                              'server_post')
  if any(place[e.outvars[0]] in ('clients', 'uniform') for e in post_eqns):
    raise ExportError('a server output depends on client values other than the aggregates')
  server_post = _program(closed, post_eqns, _used(post_in, post_eqns, server_out), server_out,
                         key_impl)
  client = _client_program(closed_one, jaxpr, client_in, client_out, key_impl)
  return Split(server_pre, client, server_post, communication, n)


def _client_program(closed_one: core.ClosedJaxpr, jaxpr: core.Jaxpr, inputs: list[tuple],
                    outputs: list[tuple], key_impl: str) -> Program:
  """The client program, from the one-client trace aligned with the N-client `jaxpr`."""
  one = closed_one.jaxpr
  to_one = _var_map(jaxpr, one, _aligned(jaxpr, one))
  # The boundaries pair up exactly: the federated equations in order, and the outputs.
  fed, fed_one = ([e for e in j.eqns if e.primitive in FEDERATED] for j in (jaxpr, one))
  if [e.primitive for e in fed] != [e.primitive for e in fed_one]:
    raise ExportError('the one-client round has other federated primitives than the round')
  for e, f in zip(fed, fed_one):
    to_one.update((a, b) for a, b in zip([*e.invars, *e.outvars], [*f.invars, *f.outvars])
                  if _is_var(a) and _is_var(b))
  to_one.update((a, b) for a, b in zip(jaxpr.outvars, one.outvars) if _is_var(a) and _is_var(b))
  for v, name, *rest in [*inputs, *outputs]:
    axis = rest[0] if rest else 0
    want = list(v.aval.shape)
    if axis is not None:
      want[axis] = 1
    if v not in to_one or list(to_one[v].aval.shape) != want:
      raise ExportError(f'cannot find the client value {name} ({v.aval.str_short()}) in the '
                        'one-client trace of the round')
  one_in = [(to_one[v], name, axis) for v, name, axis in inputs]
  one_out = [(to_one[v], name, 0) for v, name in outputs]
  eqns = _backward_slice(one, [v for v, _, _ in one_out], {v for v, _, _ in one_in}, 'client')
  return _program(closed_one, eqns, one_in, one_out, key_impl)


def _used(inputs: list[tuple], eqns: list[core.JaxprEqn], outputs: list[tuple]) -> list[tuple]:
  """The inputs that `eqns` read or that pass straight through to `outputs`, in order."""
  read = {v for e in eqns for v in e.invars if _is_var(v)}
  read |= {v for v, _, _ in outputs if _is_var(v)}
  return [i for i in inputs if i[0] in read]
