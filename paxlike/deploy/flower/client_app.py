"""The Flower ClientApp of an exported round: one node, the clients it serves, their own data.

Node config (`flower-supernode --node-config`): `export-dir` (the export: plan.json and
client.jaxexport), `config` (the experiment's saved config, for paxlike's data pipeline),
`clients` (the client ids this node holds, "0,3"), optional `log` (a JSONL file of what it ran).

A `query` message (a node's first) is answered with the sha256 of the node's config file and of
its plan.json, so that the server refuses a node of another experiment or export, and with the
node's client ids and their sizes in examples. A `train`
message names the round's step, the live clients the cohort was drawn among and, for each
cohort slot this node serves, its slot and client id, plus the values the server sends down
(each slot's own, the broadcasts once for all slots, and the `once` values the node does not
hold yet, which it keeps in `context.state`: once.py). For each slot the node draws the
cohort and that slot's batches in the simulation's (seed, step) order (`data.round_batches`
for that cohort, its own slot only), runs the client program, and replies with the
contributions. A slot whose client it does not hold, or whose cohort the data disagrees with,
is an error reply naming it.

State the plan carries at the clients stays on the node (client_state.py, in the node config's
`state-dir`): a train message names each slot's version of it, the node reads that row from
its store (or the export's, or one another node sealed for it), and keeps the new one; its
reply carries the contributions only. A `query.handoff` message asks it to seal a version it
holds for the node that runs that slot next.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from paxlike.data.sources import PADDED
from paxlike.deploy.flower import client_state, once, records, rounds

app = ClientApp()


def _node_settings(context: Context) -> tuple[str, str, list[int]]:
  config = context.node_config
  return str(config['export-dir']), str(config['config']), records.int_list(config['clients'])


@app.query()
def query(msg: Message, context: Context) -> Message:
  """This node's config and plan hashes, its client ids and their sizes."""
  from paxlike.deploy.flower.membership import file_sha256
  export_dir, config_file, clients = _node_settings(context)
  sizes = records.client_sizes(records.load_task(config_file).data)
  reply = ConfigRecord({'clients': clients, 'sizes': [int(sizes[c]) for c in clients],
                        'config_sha256': file_sha256(config_file),
                        'plan_sha256': file_sha256(Path(export_dir) / 'plan.json')})
  state_dir = context.node_config.get('state-dir')
  if state_dir:  # Client state (client_state.py): the node's key, the versions it holds.
    reply['state_key'] = client_state.public_hex(client_state.node_key(state_dir))
    held = client_state.Store(state_dir).held()
    if held:
      reply['state_held'] = [f'{s}@{v}' for s, v in held]
  return Message(RecordDict({'node': reply}), reply_to=msg)


def client_inputs(plan: dict[str, Any], data: Any, seed: int, step: int, slot: int,
                  client: int, live: list[int], down: dict[str, np.ndarray]) -> list[np.ndarray]:
  """The client program's arguments for cohort slot `slot` (client `client`, or PADDED) of
  round `step`: the values sent down, then this slot's own batches and weight from the data
  pipeline, drawn for the cohort among the `live` clients (the simulation's when all are)."""
  cohort = records.cohort(data, seed, step, records.client_sizes(data), live)
  if int(cohort[slot]) != client:
    raise ValueError(f'round {step} slot {slot} is client {int(cohort[slot])} here, the server '
                     f'says {client}: the node and the server run different experiments')
  batch, weights = data.round_batches(seed, step, clients=slice(slot, slot + 1), cohort=cohort)
  own = {'weights': np.asarray(weights[slot], np.float32)}
  own.update({f'batches.{key}': np.asarray(value)[0] for key, value in batch.items()})
  args = []
  for spec in plan['programs']['client']['inputs']:
    value = down.get(spec['name'], own.get(spec['name']))
    if value is None:
      raise ValueError(f'the client program reads {spec["name"]}, which neither the server '
                       'sent nor this node has')
    # Flower's Array carries a 0-d array as shape (1,): the plan's shape is the truth.
    args.append(np.asarray(value, spec['dtype']).reshape(spec['shape']))
  return args


def _process_age() -> float:
  """Seconds since this process started (Linux /proc; 0.0 elsewhere)."""
  try:
    start = float(Path('/proc/self/stat').read_text().rsplit(')', 1)[1].split()[19])
  except (OSError, IndexError, ValueError):
    return 0.0
  return time.clock_gettime(time.CLOCK_BOOTTIME) - start / os.sysconf('SC_CLK_TCK')


def _cache_compiles(jax: Any) -> None:
  """Keeps the client program's compile in paxlike's persistent cache (every compile, not only
  those over JAX's 1 s default): Flower starts a fresh ClientApp process per message, which
  would otherwise compile the program again each round. A process whose cache is already set
  (a test's) is left as it is."""
  if jax.config.jax_compilation_cache_dir:
    return
  from paxlike.trainer import compile_cache
  if compile_cache.configure(compile_cache.default_dir()):
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)


def _state_rows(context: Context, plan: dict[str, Any], slots: list[int], versions: list[int],
                received: dict[str, np.ndarray]) -> tuple[Any, dict[int, dict[str, np.ndarray]]]:
  """(the node's client state store, each slot's row of the version the server named): from
  the store, the export (its start step's version) or sealed for this node by another."""
  names = rounds.client_state(plan)
  if not names:
    return None, {}
  state_dir = context.node_config.get('state-dir')
  if not state_dir:
    raise ValueError('the plan keeps state at the clients, and this node has no state-dir '
                     '(node config) to keep it in')
  store, rows = client_state.Store(state_dir), {}
  for slot, version in zip(slots, versions):
    sealed = received.get(records.slot_key(slot, 'sealed'))
    rows[slot] = (client_state.unseal(client_state.node_key(state_dir), sealed, slot, version)
                  if sealed is not None else store.row(slot, version))
    if rows[slot] is None and version == plan['start_step']:
      rows[slot] = client_state.initial_row(context.node_config['export-dir'], names, slot)
    if rows[slot] is None:
      raise ValueError(f'slot {slot}\'s client state after round {version} is not on this '
                       'node and was not handed over')
  return store, rows


def run_slots(context: Context, step: int, slots: list[int], clients: list[int],
              live: list[int], received: dict[str, np.ndarray],
              kept: dict[str, np.ndarray] | None = None,
              versions: list[int] | None = None) -> dict[int, dict[str, np.ndarray]]:
  """{slot: the client program's named outputs} for this node's `slots` of round `step`
  (`live`: the clients the cohort was drawn among; `received`: the values sent down, keyed by
  records.slot_key of a slot or of records.SHARED, for all slots; `kept`: the once values the
  node holds). A PADDED slot (a Poisson cohort's unused one) runs on its all-masked
  batch, as the simulation's does. The node's log gets the
  slots it ran and where the time went: the process's start (Flower starts a ClientApp process
  per message), loading the program and the data, and the programs."""
  entered = time.perf_counter()
  import jax
  _cache_compiles(jax)
  export_dir, config_file, held = _node_settings(context)
  plan = records.read_plan(export_dir)
  blob = (Path(export_dir) / plan['programs']['client']['file']).read_bytes()
  program = jax.export.deserialize(bytearray(blob))
  task = records.load_task(config_file)
  store, state_rows = _state_rows(context, plan, slots, versions or [], received)
  outputs, compute = {}, 0.0
  loaded = time.perf_counter()
  for slot, client in zip(slots, clients):
    if client not in held and client != PADDED:
      raise ValueError(f'this node does not hold client {client}')
    down = {**(kept or {}), **records.with_prefix(received, records.SHARED),
            **records.with_prefix(received, slot), **state_rows.get(slot, {})}
    args = client_inputs(plan, task.data, task.train.seed, step, slot, client, live, down)
    began = time.perf_counter()
    results = [np.asarray(value) for value in program.call(*args)]
    compute += time.perf_counter() - began
    outputs[slot] = {spec['name']: value
                     for spec, value in zip(plan['programs']['client']['outputs'], results)}
    if store is not None:
      store.put(slot, step, {n: outputs[slot].pop(n) for n in state_rows[slot]})
  if store is not None:
    store.save()  # Before the reply: a round the server counts is on disk.
  log = context.node_config.get('log')
  if log:
    seconds = {'start_seconds': _process_age() - (time.perf_counter() - entered),
               'load_seconds': loaded - entered,
               'data_seconds': time.perf_counter() - loaded - compute,
               'compute_seconds': compute}
    with open(str(log), 'a') as f:
      f.write(json.dumps({'step': step, 'slots': slots, 'clients': clients, **seconds}) + '\n')
  return outputs


@app.train()
def train(msg: Message, context: Context) -> Message:
  """Runs the client program for each slot of this node in the message's round."""
  round_config = msg.content['round']
  slots, clients = list(round_config['slots']), list(round_config['clients'])
  received = records.from_record(msg.content['down'])
  kept = once.kept(context, records.with_prefix(received, records.ONCE))
  by_slot = run_slots(context, int(round_config['step']), slots, clients,
                      list(round_config['live']), received, kept,
                      list(round_config.get('versions', [])))
  outputs = {records.slot_key(slot, name): value
             for slot, named in by_slot.items() for name, value in named.items()}
  return Message(RecordDict({'up': records.to_record(outputs)}), reply_to=msg)


@app.query('handoff')
def handoff(msg: Message, context: Context) -> Message:
  """Each asked slot's row of the asked version, sealed for the node (public key) that runs
  the slot next; a slot this node does not hold that version of is left out."""
  asked = msg.content['handoff']
  store, sealed = client_state.Store(context.node_config['state-dir']), {}
  for slot, version, key in zip(asked['slots'], asked['versions'], asked['keys']):
    row = store.row(int(slot), int(version))
    if row is not None:
      sealed[str(slot)] = client_state.seal(row, str(key), int(slot), int(version))
  return Message(RecordDict({'sealed': records.to_record(sealed)}), reply_to=msg)
