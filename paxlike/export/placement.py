"""Placements of a federated round's values, read off its jaxpr's federated primitives.

Forward over the jaxpr of the round:

- the client-placed inputs (batches, weights, client state) are `clients`;
- a `federated_broadcast` output is `uniform` (placed at the clients, the same at each), and so
  is anything computed from uniform, server and constant values only (e.g. the 1/N that the
  transpose of `federated_mean` applies to a broadcast cotangent);
- an equation with a `clients` operand is `clients` (what `federated_map`'s vmap leaves), and
  so is one reading a server value that has a clients axis (per-client rngs split on the
  server: each client takes its row and carries on); but an output with no clients axis is
  placed by the operands it depends on (jax's dead-code elimination of the equation): a
  client loop's output that reads no client value, such as the step count of a client
  optimizer created inside `federated_map` (vmap leaves it unbatched: the same at every
  client), is a server (or constant) value, not a client one;
- `federated_sum` / `federated_mean` give a server value computed from the clients (`after`);
- everything else is `server`, or `const` when it depends on no input.

The clients axis of every value is the axis that changes between traces at N and N + 1
clients. A broadcast of a value computed from an aggregate (a second round trip), a federated
primitive inside a control-flow body (PAPA's `lax.cond` averaging), a value computed from
client values with no clients axis (reduced across clients by an ordinary op) or with a shape
that changes with the cohort in another way, or client code whose constants change with the
cohort size is refused with a one-line `ExportError` naming the equation.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core
from jax.interpreters import partial_eval as pe

from paxlike.errors import UserError
from paxlike.federated import chunking
from paxlike.federated.primitives import broadcast_p, mean_p, sum_p

AGGREGATIONS = {sum_p: 'sum', mean_p: 'mean'}
FEDERATED = (broadcast_p, sum_p, mean_p)


class ExportError(UserError):
  """A round this exporter cannot split faithfully (exit code 2, one line)."""


@dataclasses.dataclass(frozen=True)
class PlacedRound:
  """The round's jaxpr at N clients, each var's placement and clients axis (None: none)."""

  closed: core.ClosedJaxpr
  place: dict[core.Var, str]
  axis: dict[core.Var, int | None]
  clients: int

  @property
  def jaxpr(self) -> core.Jaxpr:
    return self.closed.jaxpr


def is_var(atom: Any) -> bool:
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


def var_map(a: core.Jaxpr, b: core.Jaxpr, pairs: Sequence[tuple[int, int]]) -> dict:
  """Vars of `a` to vars of `b`: inputs, constants, and the outputs of paired equations."""
  mapping = dict(zip(a.invars, b.invars))
  if len(a.constvars) == len(b.constvars):
    mapping.update(zip(a.constvars, b.constvars))
  for i, j in pairs:
    mapping.update(zip(a.eqns[i].outvars, b.eqns[j].outvars))
  return mapping


def aligned(a: core.Jaxpr, b: core.Jaxpr) -> list[tuple[int, int]]:
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


def _depends_on(eqn: core.JaxprEqn, k: int) -> list[core.Var]:
  """The operands of `eqn` that its k-th output depends on (jax's dead-code elimination of
  the equation: a scan's carry that never reads the scanned inputs depends on its init alone)."""
  operands = list(dict.fromkeys(a for a in eqn.invars if is_var(a)))
  info = core.DebugInfo('export placement', None, ('',) * len(operands), ('',))
  alone = core.Jaxpr([], operands, [eqn.outvars[k]], [eqn], eqn.effects, debug_info=info)
  _, used = pe.dce_jaxpr(alone, [True])
  return [v for v, u in zip(operands, used) if u]


def _place(kinds: set[str], scattered: bool) -> str:
  """The placement of an equation's output whose operands have placements `kinds`."""
  if 'clients' in kinds or scattered:
    return 'clients'
  return next(k for k in ('uniform', 'after', 'server', 'const') if k in kinds | {'const'})


def _placements(jaxpr: core.Jaxpr, in_places: Sequence[str],
                axis: Callable[[core.Var], int | None]) -> dict[core.Var, str]:
  """'const', 'server', 'uniform', 'clients' or 'after' for every var (see the module doc)."""
  place: dict[core.Var, str] = {v: 'const' for v in jaxpr.constvars}
  place.update(zip(jaxpr.invars, in_places))
  kinds_of = lambda atoms: {place[a] if is_var(a) else 'const' for a in atoms}
  scatters = lambda atoms: any(is_var(a) and place[a] == 'server' and axis(a) is not None
                               for a in atoms)
  for index, eqn in enumerate(jaxpr.eqns):
    where = f'equation {index} ({eqn.primitive.name})'
    if any(e.primitive in FEDERATED for j in _sub_jaxprs(eqn) for e in j.eqns):
      raise ExportError(f'{where} has federated primitives inside its body (e.g. averaging '
                        'under lax.cond): only one broadcast → clients → aggregation round '
                        'at the top level can be split')
    kinds, scattered = kinds_of(eqn.invars), scatters(eqn.invars)
    if 'after' in kinds and (eqn.primitive in FEDERATED or kinds & {'clients', 'uniform'}
                             or scattered):
      raise ExportError(f'{where} sends a value computed from an aggregate back to the '
                        'clients: the round has two communication rounds')
    if eqn.primitive is broadcast_p:
      if kinds & {'clients', 'uniform'}:
        raise ExportError(f'{where} broadcasts a value that is already at the clients')
      place.update((v, 'uniform') for v in eqn.outvars)
    elif eqn.primitive in AGGREGATIONS:
      # Of any value with a clients axis: constants too (a client learning rate).
      place.update((v, 'after') for v in eqn.outvars)
    else:
      out = _place(kinds, scattered)
      for k, v in enumerate(eqn.outvars):
        if out == 'clients' and axis(v) is None:  # Unbatched by vmap, or across clients?
          deps = _depends_on(eqn, k)
          place[v] = _place(kinds_of(deps), scatters(deps))
        else:
          place[v] = out
  return place


def _refuse_unaxed(jaxpr: core.Jaxpr, place: dict, axis: dict, more: dict) -> None:
  """Refuses a value at the clients without one clients axis, naming what made it."""
  producer = {v: (i, e) for i, e in enumerate(jaxpr.eqns) for v in e.outvars}
  for v, p in place.items():
    if p not in ('clients', 'uniform') or isinstance(axis.get(v), int):
      continue
    index, eqn = producer.get(v, (None, None))
    what = (f'value {v.aval.str_short()}' + ('' if eqn is None else
            f' (equation {index}, {eqn.primitive.name})'))
    if axis.get(v) == 'bad':
      raise ExportError(f'{what} is at the clients but its shape does not follow the cohort '
                        f'along one clients axis ({v.aval.str_short()} at N, '
                        f'{more[v].aval.str_short()} at N + 1 clients)')
    raise ExportError(f'{what} is computed from client values but has no clients axis: it '
                      'combines clients with an ordinary op (e.g. a jnp reduction over the '
                      'clients axis) instead of federated_sum / federated_mean')


def specs(args: Any, placed: Sequence[bool], clients: int) -> Any:
  """`args` as ShapeDtypeStructs with `clients` on the leading axis of client-placed leaves."""
  leaves, treedef = jax.tree.flatten(args)
  return jax.tree.unflatten(treedef, [
      jax.ShapeDtypeStruct((clients, *jnp.shape(x)[1:]) if p else jnp.shape(x),
                           x.dtype if hasattr(x, 'dtype') else jnp.result_type(x),
                           weak_type=getattr(x, 'weak_type', False))
      for x, p in zip(leaves, placed)])


def round_jaxpr(fn: Callable, args: Sequence[Any]) -> core.ClosedJaxpr:
  """The jaxpr of `fn(*args)` with every client mapped at once, whatever the platform's default
  `client_chunk`: chunked clients run in a loop, which the placement cannot split."""
  with chunking.all_clients_at_once():
    return jax.make_jaxpr(fn)(*args)


def placed_round(fn_at: Callable[[int], Callable], args: Sequence[Any],
                 placed: Sequence[bool], clients: int) -> PlacedRound:
  """Traces `fn_at(N)` and `fn_at(N + 1)` and places every value of the first (see above)."""
  closed = round_jaxpr(fn_at(clients), specs(args, placed, clients))
  more = round_jaxpr(fn_at(clients + 1), specs(args, placed, clients + 1)).jaxpr
  jaxpr = closed.jaxpr
  if not _same_structure(jaxpr, more):
    raise ExportError(f'the round runs different equations for {clients} and {clients + 1} '
                      'clients')
  to_more = var_map(jaxpr, more, [(i, i) for i in range(len(jaxpr.eqns))])
  axis = {v: _clients_axis(v.aval, to_more[v].aval) for v in to_more}
  place = _placements(jaxpr, ['clients' if p else 'server' for p in placed],
                      lambda v: axis.get(v) if axis.get(v) != 'bad' else None)
  _refuse_unaxed(jaxpr, place, axis, to_more)
  for e, m in zip(jaxpr.eqns, more.eqns):
    a, b = _literals(e), _literals(m)
    if any(place[v] == 'clients' for v in e.outvars) and (
        len(a) != len(b) or not all(np.array_equal(x, y) for x, y in zip(a, b))):
      raise ExportError(f'the client computation ({e.primitive.name}) uses a constant that '
                        'depends on the number of clients, so it differs per cohort size')
  return PlacedRound(closed, place, {v: a for v, a in axis.items() if a != 'bad'}, clients)
