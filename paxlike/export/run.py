"""Reference executor of an export directory: what a production federated runtime would do.

  python -m paxlike.export.run --dir=DIR --rounds=R [--out=FILE.npz]

Loads only DIR (plan.json, the jax.export programs, the Orbax state, rounds.npz): no
experiment code, no Fiddle, nothing else of paxlike. Per round: the server_pre program; each
client's program on that client's own inputs, one client at a time (a value the plan
broadcasts `once`, e.g. a frozen LoRA base, a client gets in its first round and keeps); the
aggregations here, in numpy; then server_post. Carried inputs (the algorithm state, server-
and client-placed) are replaced by the outputs of the same name. Prints one JSON line of
scalar outputs per round; `--out` saves the last round's outputs. A plan it cannot trust
(unknown format or aggregation, shapes that disagree with the programs or the data) is exit 2
with one line on stderr.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = 'paxlike-export/1'
PROGRAMS = ('server_pre', 'client', 'server_post')
DOWN = ('broadcast', 'scatter')
UP = ('sum', 'mean')


class PlanError(Exception):
  """The directory cannot be trusted or read as a plan (exit code 2)."""


@dataclasses.dataclass
class Export:
  """A loaded and checked export directory."""

  plan: dict[str, Any]
  programs: dict[str, Any]        # name -> jax.export.Exported
  carried: dict[str, np.ndarray]  # the state: carried inputs by name
  rounds: dict[str, np.ndarray]   # the other inputs by name, [rounds, ...]


def _shape(spec: dict[str, Any]) -> tuple[tuple[int, ...], str]:
  return tuple(spec['shape']), spec['dtype']


def load(directory: str | Path) -> Export:
  """Reads and checks DIR; PlanError (one line) on anything that does not fit."""
  import jax  # Imported here so that --help stays fast.
  directory = Path(directory)
  try:
    plan = json.loads((directory / 'plan.json').read_text())
  except (OSError, json.JSONDecodeError) as error:
    raise PlanError(f'{directory / "plan.json"} is not a readable plan ({error})') from None
  try:
    return _checked(directory, plan, jax)
  except (KeyError, TypeError, ValueError, IndexError) as error:
    raise PlanError(f'plan.json is malformed ({type(error).__name__}: {error})') from None


def _checked(directory: Path, plan: dict[str, Any], jax: Any) -> Export:
  """The export in `directory` once every shape the plan declares agrees with its programs,
  its communication and its inputs (PlanError naming the first that does not)."""
  if plan.get('format') != FORMAT:
    raise PlanError(f'plan.json has format {plan.get("format")!r}, this executor reads {FORMAT}')
  for entry in plan['communication']:
    if entry['kind'] not in DOWN + UP:
      raise PlanError(f'plan.json has unknown aggregation {entry["kind"]!r} '
                      f'(known: {", ".join(DOWN + UP)})')
  clients, inputs = plan['clients'], {s['name']: s for s in plan['inputs']}
  known = {n: _shape(s) for n, s in inputs.items()}  # Server-side shapes of every value.
  programs = _checked_programs(directory, plan, jax, known)
  _check_client_inputs(plan, inputs, known, clients)
  _check_aggregations(plan, known)
  carried, rounds = _checked_inputs(directory, inputs)
  return Export(plan, programs, carried, rounds)


def _checked_programs(directory: Path, plan: dict[str, Any], jax: Any,
                      known: dict[str, tuple]) -> dict[str, Any]:
  """The deserialized programs, each checked against its declared inputs and outputs; adds
  server_pre's outputs to `known`."""
  programs = {}
  for name in PROGRAMS:
    spec = plan['programs'][name]
    try:
      blob = (directory / spec['file']).read_bytes()
    except OSError as error:
      raise PlanError(f'cannot read the {name} program ({error.strerror})') from None
    exported = programs[name] = jax.export.deserialize(bytearray(blob))
    for side, avals in (('inputs', exported.in_avals), ('outputs', exported.out_avals)):
      declared = spec[side]
      if len(declared) != len(avals):
        raise PlanError(f'plan.json lists {len(declared)} {name} {side}, the program has '
                        f'{len(avals)}')
      for d, a in zip(declared, avals):
        if _shape(d) != (tuple(a.shape), str(np.dtype(a.dtype))):
          raise PlanError(f'plan.json says {name} {side[:-1]} {d["name"]} is {d["dtype"]}'
                          f'{d["shape"]}, the program has {a.dtype}{list(a.shape)}')
    if name == 'server_pre':
      known.update((d['name'], _shape(d)) for d in spec['outputs'])

  return programs


def _check_client_inputs(plan: dict[str, Any], inputs: dict[str, dict], known: dict[str, tuple],
                         clients: int) -> None:
  """Each client program input is sent down or client-placed, with the per-client shape."""
  client_shapes = {d['name']: _shape(d) for d in plan['programs']['client']['inputs']}
  down = {e['value']: e for e in plan['communication'] if e['kind'] in DOWN}
  for name, (shape, dtype) in client_shapes.items():
    if name in down:
      server_shape, server_dtype = known[name]
      entry = down[name]
      if entry['kind'] == 'scatter':
        axis = entry['axis']
        if not 0 <= axis < len(server_shape) or server_shape[axis] != clients:
          raise PlanError(f'plan.json scatters {name} along axis {axis}, which is not '
                          f'{clients} clients long in {list(server_shape)}')
        server_shape = server_shape[:axis] + server_shape[axis + 1:]
    elif name in inputs and inputs[name]['placement'] == 'clients':
      (server_shape, server_dtype), axis = known[name], 0
      if not server_shape or server_shape[0] != clients:
        raise PlanError(f'plan.json places {name} at {clients} clients but its shape is '
                        f'{list(server_shape)}')
      server_shape = server_shape[1:]
    else:
      raise PlanError(f'the client program reads {name}, which is neither sent down nor a '
                      'client-placed input')
    if (server_shape, server_dtype) != (shape, dtype):
      raise PlanError(f'plan.json gives {name} as {server_dtype}{list(server_shape)} per '
                      f'client, the client program takes {dtype}{list(shape)}')


def _check_aggregations(plan: dict[str, Any], known: dict[str, tuple]) -> None:
  """Each aggregation reads a client output; server_post reads what the plan makes (adds the
  aggregated results to `known`)."""
  client_out = {d['name']: _shape(d) for d in plan['programs']['client']['outputs']}
  for entry in plan['communication']:
    if entry['kind'] in UP:
      if entry['value'] not in client_out:
        raise PlanError(f'plan.json aggregates {entry["value"]}, which no client outputs')
      shape, dtype = client_out[entry['value']]
      result_dtype = _sum_dtype if entry['kind'] == 'sum' else _mean_dtype
      known[entry['result']] = (shape, result_dtype(dtype))
  for d in plan['programs']['server_post']['inputs']:
    if known.get(d['name']) != _shape(d):
      shape, dtype = known.get(d['name'], ((), 'nothing'))
      raise PlanError(f'server_post reads {d["name"]} as {d["dtype"]}{d["shape"]}, but the plan '
                      f'makes it {dtype}{list(shape)}')


def _checked_inputs(directory: Path, inputs: dict[str, dict]) -> tuple[dict, dict]:
  """(carried state, rounds.npz arrays), each input's shape as the plan says."""
  carried = _restore(directory / 'state') if any(s['carried'] for s in inputs.values()) else {}
  try:
    with np.load(directory / 'rounds.npz') as data:
      rounds = dict(data)
  except OSError as error:
    raise PlanError(f'cannot read rounds.npz ({error})') from None
  for name, spec in inputs.items():
    source, array = (('state', carried.get(name)) if spec['carried']
                     else ('rounds.npz', rounds.get(name)))
    got = None if array is None else (array.shape if spec['carried'] else array.shape[1:])
    if got is None or (tuple(got), str(array.dtype)) != _shape(spec):
      raise PlanError(f'plan.json says input {name} is {spec["dtype"]}{spec["shape"]}, '
                      f'{source} has {"nothing" if got is None else f"{array.dtype}{list(got)}"}')
  return carried, rounds


def _mean_dtype(dtype: str) -> str:
  """federated_mean's result dtype: floats keep theirs, the rest is float32."""
  return dtype if np.issubdtype(np.dtype(dtype), np.inexact) else 'float32'


def _sum_dtype(dtype: str) -> str:
  """federated_sum's result dtype (as jnp.sum): bools and narrow ints widen to 32 bits."""
  if not (dtype == 'bool' or np.issubdtype(np.dtype(dtype), np.integer)):
    return dtype
  wide = np.uint32 if np.issubdtype(np.dtype(dtype), np.unsignedinteger) else np.int32
  return str(np.promote_types(dtype, wide))


def _restore(path: Path) -> dict[str, np.ndarray]:
  import orbax.checkpoint as ocp
  try:
    with ocp.StandardCheckpointer() as checkpointer:
      restored = checkpointer.restore(path.absolute())
  except Exception as error:  # Orbax raises many kinds for missing or damaged checkpoints.
    raise PlanError(f'cannot restore the state in {path} ({type(error).__name__})') from None
  return {name: np.asarray(value) for name, value in restored.items()}


def _call(exported: Any, args: list[np.ndarray]) -> list[np.ndarray]:
  return [np.asarray(y) for y in exported.call(*args)]


def run_round(ex: Export, values: dict[str, np.ndarray],
              kept: list[dict[str, np.ndarray]] | None = None) -> dict[str, np.ndarray]:
  """One round from the named inputs `values`; the named outputs. `kept`: per client, the
  values broadcast once (`'once': true`, e.g. a frozen base) that it holds from an earlier
  round, which it uses instead of this round's (it is sent those it lacks, and keeps them)."""
  kept = [{} for _ in range(ex.plan['clients'])] if kept is None else kept
  plan, programs = ex.plan, ex.programs
  spec = plan['programs']
  env = dict(values)
  pre = spec['server_pre']
  env.update(zip((d['name'] for d in pre['outputs']),
                 _call(programs['server_pre'], [env[d['name']] for d in pre['inputs']])))
  down = {e['value']: e for e in plan['communication'] if e['kind'] in DOWN}

  def client_value(name: str, i: int) -> np.ndarray:
    entry = down.get(name)
    if entry is None:
      return env[name][i]  # A client-placed input: this client's row.
    if entry['kind'] == 'scatter':
      return np.take(env[name], i, axis=entry['axis'])
    if entry.get('once'):
      return kept[i].setdefault(name, env[name])
    return env[name]

  client, contributions = spec['client'], []
  for i in range(plan['clients']):  # Each client on its own inputs only.
    outs = _call(programs['client'], [client_value(d['name'], i) for d in client['inputs']])
    contributions.append(dict(zip((d['name'] for d in client['outputs']), outs)))
  for entry in plan['communication']:
    if entry['kind'] in UP:
      stacked = np.stack([c[entry['value']] for c in contributions])
      dtype = str(stacked.dtype)
      env[entry['result']] = (np.sum(stacked, axis=0, dtype=_sum_dtype(dtype))
                              if entry['kind'] == 'sum' else
                              np.mean(stacked.astype(_mean_dtype(dtype)), axis=0))
  post = spec['server_post']
  outputs = dict(zip((d['name'] for d in post['outputs']),
                     _call(programs['server_post'], [env[d['name']] for d in post['inputs']])))
  uplinked = {e['value'] for e in plan['communication']}
  for d in client['outputs']:
    if d['name'] not in uplinked:  # Client-placed outputs (client state): stacked by client.
      outputs[d['name']] = np.stack([c[d['name']] for c in contributions])
  return outputs


def run_rounds(ex: Export, rounds: int) -> list[dict[str, np.ndarray]]:
  """Runs `rounds` rounds from the exported state; every round's named outputs."""
  if not 1 <= rounds <= ex.plan['rounds']:
    raise PlanError(f'--rounds={rounds}: the export holds inputs for 1 to {ex.plan["rounds"]} '
                    'rounds')
  carried, history = dict(ex.carried), []
  kept = [{} for _ in range(ex.plan['clients'])]  # What each client keeps of 'once' values.
  for r in range(rounds):
    values = {**carried, **{n: a[r] for n, a in ex.rounds.items()}}
    outputs = run_round(ex, values, kept)
    carried = {n: outputs[n] for n in carried}
    history.append(outputs)
  return history


def main(argv: list[str]) -> None:
  from absl import app, flags
  app.define_help_flags()  # --help: this docstring and these flags, as absl's app.run gives.
  flags.DEFINE_string('dir', None, 'The export directory (python -m paxlike.export --out).')
  flags.DEFINE_integer('rounds', 1, 'Rounds to run (at most the rounds the export holds).')
  flags.DEFINE_string('out', None, 'Optional .npz for the last round\'s outputs (must be new).')
  try:
    flags.FLAGS(argv)
    if not flags.FLAGS.dir:
      raise PlanError('--dir is required')
    if flags.FLAGS.out and os.path.exists(flags.FLAGS.out):
      raise PlanError(f'--out={flags.FLAGS.out} already exists; choose a new file')
    history = run_rounds(load(flags.FLAGS.dir), flags.FLAGS.rounds)
  except (PlanError, flags.Error) as error:
    print(f'paxlike.export.run: error: {error}', file=sys.stderr)
    sys.exit(2)
  for r, outputs in enumerate(history, 1):
    print(json.dumps({'round': r, **{n: v.item() for n, v in outputs.items() if v.size == 1}}))
  if flags.FLAGS.out:  # np.savez's name: .npz added unless there.
    from paxlike.core import files as file_io  # Stdlib only; the executor stays paxlike-free.
    out = flags.FLAGS.out if flags.FLAGS.out.endswith('.npz') else flags.FLAGS.out + '.npz'
    with file_io.open_atomic(out, binary=True) as file:
      np.savez(file, **history[-1])


if __name__ == '__main__':
  main(sys.argv)
