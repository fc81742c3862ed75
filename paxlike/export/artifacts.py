"""Writes a split federated computation as an export directory (layout in docs/export.md).

  plan.json              placements, communication, names/shapes/trees of every value
  server_pre.jaxexport   jax.export (StableHLO) programs, flat array inputs and outputs
  client.jaxexport
  server_post.jaxexport
  state/                 Orbax checkpoint of the carried inputs (e.g. the algorithm state)
  rounds.npz             the other inputs of every round, stacked: [rounds, ...]
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from paxlike.core import files as file_io
from paxlike.errors import UserError
from paxlike.export import run
from paxlike.export import split as split_lib
from paxlike.export import trees

FORMAT = 'paxlike-export/1'
PROGRAMS = ('server_pre', 'client', 'server_post')


def _is_key(x: Any) -> bool:
  return jnp.issubdtype(x.dtype if hasattr(x, 'dtype') else np.result_type(x),
                        jax.dtypes.prng_key)


def _host(x: Any) -> np.ndarray:
  """A leaf as a numpy array; PRNG keys as their uint32 key data."""
  return np.asarray(jax.random.key_data(x) if _is_key(x) else x)


def _spec(name: str, x: Any, **extra: Any) -> dict[str, Any]:
  shape = jax.eval_shape(jax.random.key_data, x).shape if _is_key(x) else np.shape(x)
  dtype = 'uint32' if _is_key(x) else str(np.dtype(x.dtype))
  return {'name': name, 'shape': list(shape), 'dtype': dtype,
          **({'key': True} if _is_key(x) else {}), **extra}


def _avals(avals: Sequence[Any], names: Sequence[str]) -> list[dict[str, Any]]:
  return [{'name': n, 'shape': list(a.shape), 'dtype': str(np.dtype(a.dtype))}
          for n, a in zip(names, avals)]


def check_new(out: Path) -> None:
  """Refuses an `out` that has anything in it: nothing saved is ever overwritten."""
  out = Path(out)
  if out.exists() and (not out.is_dir() or any(out.iterdir())):
    raise UserError(f'--out={out} already exists and is not empty; choose a new directory')


def prepare(out: Path) -> Path:
  """`out`, created empty (see `check_new`)."""
  check_new(out)
  out = Path(out)
  try:
    out.mkdir(parents=True, exist_ok=True)
  except OSError as error:
    raise UserError(f'--out={out}: cannot create it ({error.strerror})') from None
  return out


def export(out: Path, fn_at: Callable[[int], Callable], arguments: Sequence[str],
           client_placed: dict[str, Any], carried: dict[str, Any],
           rounds: Sequence[dict[str, Any]], outputs: Sequence[str],
           meta: dict[str, Any]) -> dict[str, int]:
  """Splits `fn_at(N)` and writes the export directory `out` (which must be new or empty).

  `arguments`: fn's argument names in call order. `carried`: initial values of the arguments
  that each round's same-named output replaces (e.g. 'state'). `rounds`: the other arguments'
  values, one dict per round. `outputs`: names of fn's outputs (a tuple if more than one).
  `client_placed`: per argument, a tree of bools (leading clients axis). Returns each
  artifact's size in bytes.
  """
  check_new(out)
  args = [carried[a] if a in carried else rounds[0][a] for a in arguments]
  call_at = (lambda n: lambda *xs: (fn_at(n)(*xs),)) if len(outputs) == 1 else fn_at
  result = tuple(jax.eval_shape(call_at(_clients(args, client_placed, arguments)), *args))
  for name in carried:
    if name not in outputs or jax.tree.structure(result[outputs.index(name)]) != \
        jax.tree.structure(carried[name]):
      raise UserError(f'the output {name!r} does not have the structure of the input {name!r}')
  in_names = [n for a, x in zip(arguments, args) for n in trees.leaf_names(a, x)]
  out_names = [n for o, y in zip(outputs, result) for n in trees.leaf_names(o, y)]
  key_impl = next((str(jax.random.key_impl(x)) for x in jax.tree.leaves(args) if _is_key(x)),
                  'threefry2x32')
  split = split_lib.split(call_at, args, [client_placed[a] for a in arguments], in_names,
                          out_names, key_impl)

  placed = [p for a in arguments for p in jax.tree.leaves(client_placed[a])]
  is_carried = [a in carried for a, x in zip(arguments, args) for _ in jax.tree.leaves(x)]
  plan = {
      'format': FORMAT, **meta, 'jax_version': jax.__version__, 'clients': split.clients,
      'rounds': len(rounds), 'key_impl': key_impl,
      'inputs': [_spec(n, x, placement='clients' if p else 'server', carried=c)
                 for n, x, p, c in zip(in_names, jax.tree.leaves(args), placed, is_carried)],
      'outputs': [_spec(n, y) for n, y in zip(out_names, jax.tree.leaves(result))],
      'trees': {'inputs': {a: trees.to_json(x) for a, x in zip(arguments, args)},
                'outputs': {o: trees.to_json(y) for o, y in zip(outputs, result)}},
      'programs': {}, 'communication': split.communication,
  }
  programs = {}
  for name in PROGRAMS:
    program = getattr(split, name)
    programs[name] = exported = jax.export.export(jax.jit(program.fn))(*program.in_avals)
    plan['programs'][name] = {'file': f'{name}.jaxexport',
                              'inputs': _avals(exported.in_avals, program.inputs),
                              'outputs': _avals(exported.out_avals, program.outputs)}
  plan.update(traffic(plan))
  expected = jax.tree.leaves(jax.jit(call_at(split.clients))(*args))
  _check_reproduces(run.Export(plan, programs, {}, {}), dict(zip(
      in_names, map(_host, jax.tree.leaves(args)))), dict(zip(out_names, expected)))

  out = prepare(out)  # A bad --out is refused before anything is written.
  with file_io.dir_written(out) as temp:  # The directory appears whole, or not at all.
    _write(temp, plan, programs, arguments, carried, rounds)
  return {p.name: _size(p) for p in sorted(out.iterdir())}


def _write(out: Path, plan: dict[str, Any], programs: dict[str, Any], arguments: Sequence[str],
           carried: dict[str, Any], rounds: Sequence[dict[str, Any]]) -> None:
  """Writes the programs, the carried state (Orbax), the rounds' inputs and plan.json to
  `out`."""
  for name, exported in programs.items():
    (out / f'{name}.jaxexport').write_bytes(exported.serialize())
  state = {n: _host(x) for a in arguments if a in carried
           for n, x in zip(trees.leaf_names(a, carried[a]), jax.tree.leaves(carried[a]))}
  if state:
    with ocp.StandardCheckpointer() as checkpointer:  # Waits for the async save to commit.
      checkpointer.save((out / 'state').absolute(), state)
  data = {n: np.stack([_host(x) for x in xs]) for n, *xs in zip(
      [n for a in arguments if a not in carried for n in trees.leaf_names(a, rounds[0][a])],
      *[[x for a in arguments if a not in carried for x in jax.tree.leaves(r[a])]
        for r in rounds])}
  np.savez(out / 'rounds.npz', **data)
  (out / 'plan.json').write_text(json.dumps(plan, indent=1) + '\n')


def _check_reproduces(ex: run.Export, inputs: dict[str, np.ndarray],
                      expected: dict[str, Any]) -> None:
  """Refuses a split whose programs, run as the executor runs them (client by client), do
  not give the round's outputs on its first inputs: the placements say no client reads
  another's values, and this checks what the jaxpr alone cannot (e.g. a roll across clients).
  The tolerance is loose: per-client programs and numpy sums round differently from the
  vmapped round, and Adam turns that into up to ~1e-5 in a parameter after a few steps."""
  got = run.run_round(ex, inputs)
  for name, want in expected.items():
    want = _host(want)
    if not np.allclose(got[name], want, rtol=1e-3, atol=1e-4, equal_nan=True):
      raise split_lib.ExportError(
          f'the split programs do not reproduce the round ({name} differs by up to '
          f'{np.max(np.abs(got[name] - want)):.3g}): does a client computation read other '
          'clients\' values without a federated primitive?')


def _nbytes(spec: dict[str, Any]) -> int:
  return int(np.prod(spec['shape'], dtype=np.int64)) * jnp.dtype(spec['dtype']).itemsize


def traffic(plan: dict[str, Any]) -> dict[str, int]:
  """Bytes per client of a round's communication, from the client program's inputs and outputs
  (each communication entry gets its own `bytes`): `upload_bytes_per_client` (each value sent
  up, once however many aggregations read it), `download_bytes_per_client` (sent down every
  round), `download_once_bytes` (broadcast `once`: a frozen base), and
  `full_model_upload_bytes`, the upload if the once values were trained and sent up too, as
  full-model FedAvg sends its params (weighted in float32 or wider)."""
  client = plan['programs']['client']
  ins = {d['name']: d for d in client['inputs']}
  outs = {d['name']: d for d in client['outputs']}
  up, down, once, frozen = {}, 0, 0, 0
  for entry in plan['communication']:
    if entry['kind'] in run.UP:
      entry['bytes'] = up[entry['value']] = _nbytes(outs[entry['value']])
      continue
    spec = ins[entry['value']]
    entry['bytes'] = size = _nbytes(spec)
    if entry.get('once'):
      once += size
      frozen += _nbytes({**spec, 'dtype': jnp.promote_types(spec['dtype'], jnp.float32)})
    else:
      down += size
  upload = sum(up.values())
  return {'upload_bytes_per_client': upload, 'full_model_upload_bytes': upload + frozen,
          'download_bytes_per_client': down, 'download_once_bytes': once}


def _clients(args: Sequence[Any], client_placed: dict[str, Any], arguments: Sequence[str]) -> int:
  leaves = [x for a, v in zip(arguments, args)
            for x, p in zip(jax.tree.leaves(v), jax.tree.leaves(client_placed[a])) if p]
  return int(np.shape(leaves[0])[0]) if leaves else 1


def _size(path: Path) -> int:
  return sum(f.stat().st_size for f in path.rglob('*') if f.is_file()) if path.is_dir() \
      else path.stat().st_size


def config_hash(text: str) -> str:
  return hashlib.sha256(text.encode()).hexdigest()
