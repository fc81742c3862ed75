"""The Flower ServerApp of an exported round.

Run config (`flwr run --run-config`): `export-dir`, `config` (the experiment's saved config:
seed, cohort size and sampling), `out-dir` (rows, checkpoints and node events go there),
`rounds` (the run's last round, counted from the export's start), `timeout` (seconds a round,
or the nodes joining, may take) and `secure-aggregation` (1: the sums go through SecAgg+,
secure.py; every node takes part in every round, and a node lost during one halts SecAgg+,
which then runs the round again among the nodes still connected, if at least 3 are).

It resumes from the newest Orbax checkpoint in `out-dir` (or starts from the export's state),
asks the nodes which clients they hold (membership.py), then per round: runs server_pre on the
state and the round's key (the trainer's fold_in(key(seed), step)); samples the cohort as the
simulation does for that step, among the clients whose nodes are still connected (exactly the
simulation's cohort while none is lost); sends each node the values of the slots it runs (a
Poisson cohort's padded slots included, rounds.slots_by_node), a `once` value only when the
node lacks it (once.py); aggregates the replies as the plan's communication section says, a
slot whose node is lost during the round dropped (weight 0, as the simulation drops a
straggler); runs server_post; writes the row and checkpoints the state (progress.py).
`final.npz` holds the last state.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from paxlike.deploy.flower import (evaluate, flower_patches, membership, once, polling,
                                   progress, records, rounds, secure, secure_round,
                                   slot_versions)

app = ServerApp()


def train_messages(plan: dict[str, Any], env: dict[str, np.ndarray], draw: rounds.Draw,
                   owner: dict[int, int], step: int, sent: once.Sent,
                   versions: slot_versions.Versions | None = None,
                   sealed: dict[int, np.ndarray] | None = None
                   ) -> tuple[list[Message], list[int]]:
  """One message per node with a slot in this round's cohort (its slots, their clients, and
  the live clients the cohort was drawn among, so the node draws the same cohort); the slots
  no node runs. A message carries each slot's scattered values and client state, the
  broadcasts once for all its slots, and the `once` values the node does not hold yet; with
  client state, each slot's version and the row another node `sealed` for it, if any."""
  by_node, orphans = rounds.slots_by_node(draw.cohort, owner, draw.padded_run)
  messages = []
  for node, slots in by_node.items():
    down = {records.slot_key(s, n): v for s in slots
            for n, v in rounds.slot_down(plan, env, s, broadcasts=False).items()}
    down.update({records.slot_key(records.SHARED, n): v
                 for n, v in rounds.shared_down(plan, env).items()})
    down.update({records.slot_key(records.ONCE, n): v for n, v in sent.due(node, env).items()})
    down.update({records.slot_key(s, 'sealed'): v for s, v in (sealed or {}).items()
                 if s in slots})
    config = ConfigRecord({'step': step, 'slots': slots, 'live': draw.live,
                           'clients': [int(draw.cohort[s]) for s in slots]})
    if versions is not None and versions.names:
      config['versions'] = versions.of(slots)
    content = RecordDict({'round': config, 'down': records.to_record(down)})
    messages.append(Message(content, node, 'train', group_id=str(step)))
  return messages, orphans


def collect(plan: dict[str, Any], grid: Grid, messages: list[Message], timeout: float
            ) -> tuple[dict[int, dict[str, np.ndarray]], list[int], int]:
  """({slot: its contributions} of the nodes that replied, the nodes that did not in
  `timeout` seconds or replied with an error, the bytes of the arrays they sent)."""
  replies = {r.metadata.src_node_id: r for r in grid.send_and_receive(messages, timeout=timeout)}
  kept_at_clients = set(rounds.client_state(plan))  # The nodes keep it: not in the replies.
  specs = [d for d in plan['programs']['client']['outputs'] if d['name'] not in kept_at_clients]
  # Flower sends a 0-d array as shape (1,).
  got, missing, received = {}, [], 0
  for message in messages:
    node = message.metadata.dst_node_id
    reply = replies.get(node)
    if reply is None or reply.has_error():
      missing.append(node)
      continue
    received += records.payload_bytes(reply.content['up'])
    values = records.from_record(reply.content['up'])
    for slot in message.content['round']['slots']:
      got[slot] = {d['name']: values[records.slot_key(slot, d['name'])].reshape(d['shape'])
                   for d in specs}
  return got, missing, received


def _handoffs(plan: dict[str, Any], grid: Grid, members: membership.Members,
              versions: slot_versions.Versions, draw: rounds.Draw, step: int, timeout: float
              ) -> tuple[dict[int, np.ndarray], dict[str, Any]]:
  """The client state rows of the slots that move to another node this round, sealed by
  their holders for the receivers (slot_versions.py), and what it did: the bytes relayed and
  the slots whose holder was lost (their state starts again from the export's)."""
  if not versions.names:
    return {}, {}
  versions.forget(set(versions.holder.values()) - set(members.owner.values()))
  versions.learn({n: h for n, h in members.held.items() if n in members.owner.values()})
  by_node, _ = rounds.slots_by_node(draw.cohort, members.owner, draw.padded_run)
  sealed, relayed = versions.sealed(grid, versions.handoffs(by_node, members.keys, step),
                                    timeout)
  return sealed, {'state_handoff_bytes': relayed,
                  'state_reset_slots': versions.reset_missing(by_node, sealed)}


def _uplink(ex: Any, grid: Grid, context: Context, members: membership.Members,
            env: dict[str, np.ndarray], draw: rounds.Draw, step: int, timeout: float,
            scale: float | None, sent: once.Sent,
            versions: slot_versions.Versions | None = None
            ) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[int, dict[str, np.ndarray]]]:
  """The round's aggregates from the nodes (SecAgg+ when `scale` is set: its legacy messages
  carry what the train messages would), what it did, and each slot's outputs (none through
  SecAgg+, which sees only sums)."""
  plan, cohort = ex.plan, draw.cohort
  sealed, moved = (_handoffs(plan, grid, members, versions, draw, step, timeout)
                   if versions is not None else ({}, {}))
  messages, _ = train_messages(plan, env, draw, members.owner, step, sent, versions, sealed)
  if scale is None:
    got, missing, received = collect(plan, grid, messages, timeout)
    for node in missing:
      members.lose(node, step)
    if not got:
      raise RuntimeError(f'round {step}: no node returned its clients\' work')
    if versions is not None:
      versions.ran({s: m.metadata.dst_node_id for m in messages
                    for s in m.content['round']['slots'] if s in got}, step)
    return (rounds.aggregates(plan, [got[s] for s in sorted(got)]),
            {'dropped_slots': sorted(set(range(len(cohort))) - set(got)),
             'bytes_down': sum(records.payload_bytes(m.content['down']) for m in messages),
             'bytes_up': received, **moved}, got)
  # Every node takes part (one with no slot is sent nothing); each node gets what its train
  # message would carry: its slots' values, the broadcasts once, the once values it lacks.
  by_node = {node: ([], [], {}) for node in set(members.owner.values())}
  for m in messages:
    by_node[m.metadata.dst_node_id] = (list(m.content['round']['slots']),
                                       list(m.content['round']['clients']),
                                       records.from_record(m.content['down']))
  scales = secure.value_scales(plan, scale, len(cohort))
  sums, sent_down, attempts = _secure_sums_of_live_nodes(grid, context, members, by_node, draw,
                                                         step, scales, timeout)
  held = sorted(s for slots, _, _ in by_node.values() for s in slots)
  nodes = len(by_node)
  return (secure.aggregates(plan, sums, len(held), scales),
          {'dropped_slots': sorted(set(range(len(cohort))) - set(held)),
           'bytes_down': sent_down, 'bytes_up': None, 'secagg_attempts': attempts,
           'secagg_sum_error_bound': secure.sum_error_bound(nodes, scale),
           'secagg_mean_error_bound': secure.sum_error_bound(nodes, max(1, len(cohort)))
                                      / max(1, len(held))}, {})


def _secure_sums_of_live_nodes(grid: Grid, context: Context, members: membership.Members,
                               by_node: dict[int, Any], draw: rounds.Draw, step: int,
                               scales: dict[str, float], timeout: float
                               ) -> tuple[list[np.ndarray], int, int]:
  """SecAgg+'s sums over `by_node` (secure_round.secure_sums), the bytes sent down and the
  attempts it took. A node lost during the round halts SecAgg+ (every node's masks must be
  removed); the round then runs again among the nodes still connected, the lost node's slots
  dropped from `by_node` (weight 0, as the plain path drops them). A halt with no node lost is
  raised, and so is a round left with fewer than secure.MIN_NODES nodes (RuntimeError, one
  line): each of two would learn the other's contribution."""
  attempt = 1
  while True:
    if len(by_node) < secure.MIN_NODES:
      raise RuntimeError(f'round {step}: {len(by_node)} of the nodes left for SecAgg+, which '
                         f'needs {secure.MIN_NODES} to hide a node\'s contribution from the '
                         'others; the run stops at its last checkpoint')
    try:
      sums, sent_down = secure_round.secure_sums(grid, context, by_node, draw.live, step, scales,
                                                 timeout)
      return sums, sent_down, attempt
    except secure_round.Halted:
      members.drop_disconnected(step)
      lost = set(by_node) - set(members.owner.values())
      if not lost or lost == set(by_node):
        raise
      for node in lost:
        del by_node[node]
      attempt += 1


def run_round(ex: Any, grid: Grid, context: Context, members: membership.Members,
              carried: dict[str, np.ndarray], draw: rounds.Draw, step: int, seed: int,
              timeout: float, sent: once.Sent, scale: float | None = None,
              versions: slot_versions.Versions | None = None
              ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  """One round from the state `carried`: (server_post's named outputs, what the round did:
  its dropped slots, the array bytes sent down and up, the seconds of the server's work)."""
  plan, spec = ex.plan, ex.plan['programs']
  began = time.perf_counter()
  rng_name = next(s['name'] for s in plan['inputs'] if s.get('key'))
  env = {**carried, rng_name: rounds.rng_key_data(seed, step, plan['key_impl'])}
  env.update(rounds.named_outputs(spec['server_pre'], ex.programs['server_pre'].call(
      *rounds.program_args(spec['server_pre'], env))))
  server = time.perf_counter() - began
  aggregated, done, got = _uplink(ex, grid, context, members, env, draw, step, timeout, scale,
                                  sent, versions)
  began = time.perf_counter()
  env.update(aggregated)
  outputs = rounds.named_outputs(spec['server_post'], ex.programs['server_post'].call(
      *rounds.program_args(spec['server_post'], env)))
  return outputs, {**done, 'server_seconds': server + time.perf_counter() - began}


@app.main()
def main(grid: Grid, context: Context) -> None:
  from paxlike.data import sources
  from paxlike.export import run as executor
  from paxlike.trainer import privacy
  grid = polling.polled(grid)  # Replies collected every 0.1 s, not Flower's 3 s.
  flower_patches.apply('server_app')
  settings = context.run_config
  export_dir, out = str(settings['export-dir']), Path(str(settings['out-dir']))
  plan = (ex := executor.load(export_dir)).plan
  secure_sums = bool(settings.get('secure-aggregation', False))
  if secure_sums and (reason := secure.refusal(plan)) is not None:
    raise RuntimeError(reason)
  task = records.load_task(str(settings['config']))
  seed, data, timeout = task.train.seed, task.data, float(settings['timeout'])
  accountant = privacy.accountant(task)  # DP runs: the rows' dp_epsilon, as the trainer's.
  evaluator = evaluate.ServerEval(task, rounds.client_state(plan))  # The trainer's eval_*.
  out.mkdir(parents=True, exist_ok=True)
  last = plan['start_step'] + int(settings['rounds'])
  checkpoints = progress.open_checkpoints(out)
  try:
    start = progress.resume(checkpoints, plan['start_step'], rounds.server_state(plan, ex.carried))
    versions = slot_versions.Versions(plan, start.meta)
    identity = {'config_sha256': plan['config_sha256'],
                'plan_sha256': membership.file_sha256(Path(export_dir) / 'plan.json')}
    clients = records.population(data)  # Below: the nodes keep the client state (versions).
    members = membership.Members(grid, identity, clients, out / 'nodes.jsonl')
    lost = list(start.meta.get('lost_clients', []))
    members.wait_for(clients - len(lost), timeout)
    for client in lost:
      members.owner.pop(client, None)
    sizes = np.asarray(start.meta.get('sizes', members.sizes))
    rows, carried = progress.Rows(out, start.step, last), start.state
    sent = once.Sent(plan)  # No node holds a once value from this run yet.
    for step in range(start.step + 1, last + 1):
      members.ask_new(timeout)
      members.drop_disconnected(step)  # A node Flower no longer lists leaves before the draw.
      live = members.live()
      cohort = records.cohort(data, seed, step, sizes, live)
      draw = rounds.Draw(cohort, live, rounds.padded_slots_run(data))
      began = time.perf_counter()
      scale = (max(1.0, float(sources.cohort_weights(sizes, cohort, data.sampling).sum()))
               if secure_sums else None)
      outputs, done = run_round(ex, grid, context, members, carried, draw, step, seed,
                                timeout, sent, scale, versions)
      carried = {n: outputs[n] for n in carried}
      lost = sorted(set(range(clients)) - set(members.owner))
      seconds = time.perf_counter() - began
      evals = evaluator(carried) if evaluate.due(task, step) else None
      rows.write(step, outputs, {'nodes': members.nodes(), 'clients_lost': len(lost),
                                 'dropped_slots': len(done['dropped_slots']),
                                 **privacy.round_metrics(accountant, step)},
                 {'cohort': [int(c) for c in cohort], 'live_clients': live,
                  'lost_clients': lost, **done,
                  'round_seconds': seconds}, evals)
      progress.save(checkpoints, step, carried, sizes, lost, versions.version)
    checkpoints.wait()
    rows.close()
  finally:
    checkpoints.close()
  np.savez(out / 'final.npz', **carried)
