"""A federated round split into the programs a federated runtime runs (see placement.py):

  server_pre   server inputs → the values sent down (broadcast whole, or scattered by row)
  client       one client's values → its contribution to each aggregation, its new state
  server_post  server inputs and the aggregates → the server outputs

The server programs are slices of the round's jaxpr at N clients. The client program is a
slice of a third trace, at one client (a function mapped over clients cannot see how many
there are): aligned with the N-client jaxpr equation by equation (size-1 axes take a few other
paths through jax.numpy), with every value crossing the client boundary found in both.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax.extend import core

from paxlike.export.placement import (AGGREGATIONS, FEDERATED, ExportError, PlacedRound,
                                      aligned, is_var, placed_round, round_jaxpr, specs,
                                      var_map)
from paxlike.federated.primitives import broadcast_p

__all__ = ['ExportError', 'Program', 'Split', 'split']


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
  r = placed_round(fn_at, args, placed, sizes.pop())
  if len(in_names) != len(r.jaxpr.invars) or len(out_names) != len(r.jaxpr.outvars):
    raise ExportError("the names do not match the program's flat inputs and outputs")
  names = dict(zip(r.jaxpr.invars, in_names))
  pre_out, client_in, down = _downlink(r, names, _invariant(r.jaxpr, names, out_names))
  client_out, aggregates, up = _uplink(r, names)
  server_out = []
  for v, name in zip(r.jaxpr.outvars, out_names):
    where = r.place[v] if is_var(v) else 'const'
    if where == 'clients':
      if r.axis[v] != 0:
        raise ExportError(f'output {name} is at the clients but not along its leading axis')
      client_out.append((v, name))
    elif where == 'uniform':
      raise ExportError(f'output {name} is a broadcast value; return it before broadcasting')
    else:
      server_out.append((v, name, None))

  server_in = [(v, names[v], None) for v in r.jaxpr.invars if r.place[v] == 'server']
  server_pre = _server_program(r, server_in, pre_out, 'server_pre', key_impl)
  server_post = _server_program(r, server_in + [(v, n, None) for v, n in aggregates],
                                server_out, 'server_post', key_impl)
  one = round_jaxpr(fn_at(1), specs(args, placed, 1))
  client = _client_program(one, r.jaxpr, client_in, client_out, key_impl)
  return Split(server_pre, client, server_post, down + up, r.clients)


def _invariant(jaxpr: core.Jaxpr, names: dict, out_names: Sequence[str]) -> set[core.Var]:
  """The vars equal in every round: the inputs the round returns unchanged as the output of the
  same name (a frozen LoRA base in the state), and what is computed from them alone (with
  constants), e.g. their cast to the compute dtype."""
  same = {v for v, n in zip(jaxpr.outvars, out_names) if is_var(v) and names.get(v) == n}
  const = _constants(jaxpr)
  for eqn in jaxpr.eqns:
    operands = [a for a in eqn.invars if is_var(a)]
    if operands and all(a in same or a in const for a in operands) and not eqn.effects:
      same.update(eqn.outvars)
  return same


def _downlink(r: PlacedRound, names: dict, invariant: set) -> tuple[list, list, list[dict]]:
  """What the server sends: `(atom, name, row axis)` server_pre outputs, `(var, name, clients
  axis)` client program inputs (then the client-placed round inputs), communication entries.

  A broadcast output is sent as the value broadcast; a value computed from broadcasts as its
  row 0 (all rows are equal); a server value with a clients axis is scattered (client i gets
  row i); one without is sent whole. A value that is the same every round (`invariant`: e.g. a
  frozen base) is sent as the server inputs it is computed from (the clients compute the rest:
  a base used twice, as itself and transposed, is sent once, not twice) and marked
  `'once': True`: the clients keep it from the first round (`'of'` names the input sent).
  """
  producer = {v: e for e in r.jaxpr.eqns for v in e.outvars}
  reads = [a for e in r.jaxpr.eqns if any(r.place[v] == 'clients' for v in e.outvars)
           for a in e.invars]
  reads += [e.invars[0] for e in _live_aggregations(r.jaxpr)]
  reads = [x for a in reads for x in _sources(r, a, invariant, producer)]
  pre_out, client_in, entries = [], [], []
  for v in dict.fromkeys(a for a in reads if is_var(a) and r.place[a] in ('uniform', 'server')):
    name, axis = f'down.{len(pre_out)}', r.axis.get(v)
    if v in producer and producer[v].primitive is broadcast_p:
      pre_out.append((producer[v].invars[0], name, None))
    else:
      pre_out.append((v, name, axis if r.place[v] == 'uniform' else None))
    scatter = r.place[v] == 'server' and axis is not None
    entries.append({'kind': 'scatter', 'value': name, 'axis': axis} if scatter
                   else {'kind': 'broadcast', 'value': name,
                         **({'once': True} if v in invariant else {}),
                         **({'of': names[v]} if v in invariant and v in names else {})})
    client_in.append((v, name, axis))
  client_in += [(v, names[v], 0) for v in r.jaxpr.invars if r.place[v] == 'clients']
  return pre_out, client_in, entries


def _sources(r: PlacedRound, v: Any, invariant: set, producer: dict) -> list[Any]:
  """`[v]`, or for an invariant server value computed on the server, the server inputs it is
  computed from (in input order), for the clients to compute it from them."""
  if not is_var(v) or v not in invariant or r.place[v] != 'server' or v not in producer:
    return [v]
  roots, stack, seen = set(), [v], set()
  while stack:
    x = stack.pop()
    if x not in seen:
      seen.add(x)
      if x in producer:
        stack.extend(a for a in producer[x].invars if is_var(a))
      elif x in r.jaxpr.invars:
        roots.add(x)
  if any(r.place[x] != 'server' for x in roots):
    return [v]
  return [x for x in r.jaxpr.invars if x in roots]


def _live_aggregations(jaxpr: core.Jaxpr) -> list[core.JaxprEqn]:
  """The aggregation equations whose result is used (jax.grad leaves the forward one)."""
  used = {a for e in jaxpr.eqns for a in e.invars if is_var(a)}
  used |= {a for a in jaxpr.outvars if is_var(a)}
  return [e for e in jaxpr.eqns if e.primitive in AGGREGATIONS and e.outvars[0] in used]


def _uplink(r: PlacedRound, names: dict) -> tuple[list, list, list[dict]]:
  """What the clients send: `(var, name)` client program outputs (once per value),
  `(result var, name)` aggregates, and the communication entries in order. An aggregate of a
  client input names it (`'of': 'weights'`)."""
  client_out, aggregates, entries, up = [], [], [], {}
  for eqn in _live_aggregations(r.jaxpr):
    src = eqn.invars[0]
    if src not in up:
      up[src] = f'up.{len(up)}'
      client_out.append((src, up[src]))
    result = f'agg.{len(aggregates)}'
    aggregates.append((eqn.outvars[0], result))
    entries.append({'kind': AGGREGATIONS[eqn.primitive], 'value': up[src], 'result': result,
                    **({'of': names[src]} if src in names else {})})
  return client_out, aggregates, entries


def _server_program(r: PlacedRound, inputs: list[tuple], outputs: list[tuple], name: str,
                    key_impl: str) -> Program:
  """The slice of the round from `inputs` to `outputs`; refuses one that computes at clients."""
  eqns = _backward_slice(r.jaxpr, [a for a, _, _ in outputs], {v for v, _, _ in inputs}, name)
  if name == 'server_post' and any(r.place[v] in ('clients', 'uniform')
                                   for e in eqns for v in e.outvars):
    raise ExportError('a server output depends on client values other than the aggregates')
  return _program(r.closed, eqns, _used(inputs, eqns, outputs), outputs, key_impl)


def _constants(jaxpr: core.Jaxpr) -> set[core.Var]:
  """Vars that depend on no input."""
  const = set(jaxpr.constvars)
  for eqn in jaxpr.eqns:
    if all(not is_var(a) or a in const for a in eqn.invars):
      const.update(eqn.outvars)
  return const


def _backward_slice(jaxpr: core.Jaxpr, outputs: Sequence[Any], inputs: set,
                    program: str) -> list[core.JaxprEqn]:
  """The equations `outputs` need from `inputs` (and constants); refuses any other need."""
  const = _constants(jaxpr)
  needed = {v for v in outputs if is_var(v) and v not in inputs}
  chosen = []
  for eqn in reversed(jaxpr.eqns):
    if any(v in needed for v in eqn.outvars):
      chosen.append(eqn)
      needed.difference_update(eqn.outvars)
      needed.update(v for v in eqn.invars if is_var(v) and v not in inputs)
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
  encode = [_key_codec(v.aval, key_impl)[1] if is_var(v) else _identity for v, _, _ in outputs]

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


def _client_program(closed_one: core.ClosedJaxpr, jaxpr: core.Jaxpr, inputs: list[tuple],
                    outputs: list[tuple], key_impl: str) -> Program:
  """The client program, from the one-client trace aligned with the N-client `jaxpr`."""
  one = closed_one.jaxpr
  to_one = var_map(jaxpr, one, aligned(jaxpr, one))
  # The boundaries pair up exactly: the federated equations in order, and the outputs.
  fed, fed_one = ([e for e in j.eqns if e.primitive in FEDERATED] for j in (jaxpr, one))
  if [e.primitive for e in fed] != [e.primitive for e in fed_one]:
    raise ExportError('the one-client round has other federated primitives than the round')
  for e, f in zip(fed, fed_one):
    to_one.update((a, b) for a, b in zip([*e.invars, *e.outvars], [*f.invars, *f.outvars])
                  if is_var(a) and is_var(b))
  to_one.update((a, b) for a, b in zip(jaxpr.outvars, one.outvars) if is_var(a) and is_var(b))
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
  read = {v for e in eqns for v in e.invars if is_var(v)}
  read |= {v for v, _, _ in outputs if is_var(v)}
  return [i for i in inputs if i[0] in read]
