"""The Flower ServerApp of an exported round.

Run config (`flwr run --run-config`): `export-dir`, `config` (the experiment's saved config:
seed, cohort size and sampling), `out-dir` (metrics.jsonl and final.npz are written there),
`rounds`, `nodes` (how many SuperNodes to wait for) and `timeout` (seconds per round).

It asks every node which clients it holds and their sizes, then per round: runs server_pre on
the state and the round's key (the trainer's fold_in(key(seed), step)), samples the cohort as the
simulation does for that step, sends each node the values of the slots whose clients it holds,
aggregates the replies as the plan's communication section says, and runs server_post. Each
round's scalar outputs are a row of metrics.jsonl (`paxlike.export.run`'s rows); the final
state is final.npz.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from paxlike.deploy.flower import records, rounds

app = ServerApp()


def _replies(grid: Grid, messages: list[Message], timeout: float) -> list[Message]:
  """The replies to `messages`; RuntimeError (one line) on a missing or failed reply."""
  replies = list(grid.send_and_receive(messages, timeout=timeout))
  if len(replies) != len(messages):
    raise RuntimeError(f'{len(messages) - len(replies)} of {len(messages)} nodes did not reply '
                       f'within {timeout} s')
  for reply in replies:
    if reply.has_error():
      raise RuntimeError(f'node {reply.metadata.src_node_id} failed: {reply.error.reason}')
  return replies


def node_clients(grid: Grid, nodes: int, timeout: float) -> tuple[dict[int, int], np.ndarray]:
  """({client id: node id}, every client's size), once `nodes` nodes are connected."""
  deadline = time.monotonic() + timeout
  while len(ids := list(grid.get_node_ids())) < nodes:
    if time.monotonic() > deadline:
      raise RuntimeError(f'{len(ids)} of {nodes} SuperNodes connected after {timeout} s')
    time.sleep(1)
  messages = [Message(RecordDict({'ask': ConfigRecord({'what': 'clients'})}), node, 'query')
              for node in ids]
  owner, sizes = {}, {}
  for reply in _replies(grid, messages, timeout):
    node = reply.content['node']
    for client, size in zip(node['clients'], node['sizes']):
      if client in owner:
        raise RuntimeError(f'client {client} is held by two nodes')
      owner[client], sizes[client] = reply.metadata.src_node_id, size
  if sorted(sizes) != list(range(len(sizes))):
    raise RuntimeError(f'the nodes hold clients {sorted(sizes)}, not 0..{len(sizes) - 1}')
  return owner, np.array([sizes[c] for c in range(len(sizes))])


def train_messages(plan: dict[str, Any], env: dict[str, np.ndarray], cohort: np.ndarray,
                   owner: dict[int, int], step: int) -> list[Message]:
  """One message per node with a slot in this round's cohort."""
  by_node: dict[int, list[int]] = {}
  for slot, client in enumerate(cohort):
    by_node.setdefault(owner[int(client)], []).append(slot)
  messages = []
  for node, slots in by_node.items():
    down = {records.slot_key(s, n): v for s in slots
            for n, v in rounds.slot_down(plan, env, s).items()}
    config = ConfigRecord({'step': step, 'slots': slots,
                           'clients': [int(cohort[s]) for s in slots]})
    content = RecordDict({'round': config, 'down': records.to_record(down)})
    messages.append(Message(content, node, 'train', group_id=str(step)))
  return messages


def slot_contributions(plan: dict[str, Any], replies: list[Message], slots: int
                       ) -> list[dict[str, np.ndarray]]:
  """The replies' contributions, one dict per cohort slot in slot order."""
  got = {}
  for reply in replies:
    got.update(records.from_record(reply.content['up']))
  specs = plan['programs']['client']['outputs']  # Flower sends a 0-d array as shape (1,).
  return [{d['name']: got[records.slot_key(s, d['name'])].reshape(d['shape']) for d in specs}
          for s in range(slots)]


@app.main()
def main(grid: Grid, context: Context) -> None:
  from paxlike.data import sources
  from paxlike.export import run as executor
  settings = context.run_config
  ex = executor.load(str(settings['export-dir']))
  plan, spec = ex.plan, ex.plan['programs']
  if (reason := rounds.unsupported(plan)) is not None:
    raise RuntimeError(reason)
  task = records.load_task(str(settings['config']))
  seed, data, timeout = task.train.seed, task.data, float(settings['timeout'])
  if data.sampling == 'poisson':
    raise RuntimeError('Poisson cohorts (padded slots) are not deployed on Flower yet')
  owner, sizes = node_clients(grid, int(settings['nodes']), timeout)
  rng_name = next(s['name'] for s in plan['inputs'] if s.get('key'))
  out = Path(str(settings['out-dir']))
  out.mkdir(parents=True, exist_ok=True)
  carried = dict(ex.carried)
  for r in range(1, int(settings['rounds']) + 1):
    step = plan['start_step'] + r
    cohort = sources.sample_cohort(seed, step, sizes, data.clients_per_round, data.sampling)
    env = {**carried, rng_name: rounds.rng_key_data(seed, step, plan['key_impl'])}
    env.update(rounds.named_outputs(spec['server_pre'], ex.programs['server_pre'].call(
        *rounds.program_args(spec['server_pre'], env))))
    replies = _replies(grid, train_messages(plan, env, cohort, owner, step), timeout)
    env.update(rounds.aggregates(plan, slot_contributions(plan, replies, len(cohort))))
    outputs = rounds.named_outputs(spec['server_post'], ex.programs['server_post'].call(
        *rounds.program_args(spec['server_post'], env)))
    carried = {n: outputs[n] for n in carried}
    row = {'round': r, 'step': step, 'cohort': [int(c) for c in cohort],
           **{n: v.item() for n, v in outputs.items() if v.size == 1}}
    with open(out / 'metrics.jsonl', 'a') as f:
      f.write(json.dumps(row) + '\n')
  np.savez(out / 'final.npz', **carried)
