"""An in-process stand-in for Flower's Grid, and a deployed run over it: the ServerApp's `main`
and the ClientApp's handlers exchange every record as on a real federation, each node with its
own node config and clients, in seconds; with `secure`, the train messages are SecAgg+'s four
stages, answered through Flower's own `secaggplus_mod` around secure_client's handler. The
transport itself (SuperLink, SuperNodes, TLS, kills) is test_flower_local's."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import fiddle as fdl
from flwr.app import Context, RecordDict
from flwr.client.mod import secaggplus_mod

from paxlike.config import config_io
from paxlike.deploy.flower import client_app, records, secure_client, server_app
from paxlike.deploy.flower.rounds import clients_of_nodes

FIRST_NODE = 100  # Node k's id is FIRST_NODE + k.


class LocalGrid:
  """Flower's Grid for nodes that live in this process: `send_and_receive` calls the ClientApp
  handler of each message's type with the addressed node's context (its `state` kept between
  messages, as a SuperNode keeps it) and records each train message's array bytes by key.
  `lose_at[node] = step`: from round `step` on the node answers nothing and is no longer
  listed (a node that died during that round)."""

  def __init__(self, contexts: dict[int, SimpleNamespace], lose_at: dict[int, int] | None = None,
               secure: bool = False):
    self.contexts, self.sent, self.lose_at = contexts, [], dict(lose_at or {})
    self.secure = secure
    self.down: list[tuple[int, int, dict[str, int]]] = []  # (step, node, {key: array bytes}).

  def get_node_ids(self) -> list[int]:
    return list(self.contexts)

  def send_and_receive(self, messages, timeout: float):
    handlers = {'query': client_app.query, 'train': client_app.train,
                'query.handoff': client_app.handoff}
    self.sent += [m.metadata.message_type for m in messages]
    replies = []
    for m in messages:
      node = m.metadata.dst_node_id
      if m.metadata.message_type == 'train' and self.secure:  # A SecAgg+ stage of round group_id.
        if not self._dies(node, int(m.metadata.group_id)):  # A copy, as if sent: the mod
          replies.append(secaggplus_mod(copy.deepcopy(m), self.contexts[node],  # edits it.
                                        secure_client.train))
        continue
      if m.metadata.message_type == 'train':
        step = int(m.content['round']['step'])
        self.down.append((step, node, {k: len(a.data) for k, a in m.content['down'].items()}))
        if self._dies(node, step):
          continue
      replies.append(handlers[m.metadata.message_type](m, self.contexts[node]))
    return replies

  def _dies(self, node: int, step: int) -> bool:
    if node in self.lose_at and step >= self.lose_at[node]:
      self.contexts.pop(node, None)
      return True
    return False


def deploy(cfg: fdl.Config, export: Path, out: Path, rounds: int, nodes: int,
           lose_at: dict[int, int] | None = None, secure: bool = False,
           again: bool = False) -> LocalGrid:
  """Runs `rounds` exported rounds through the apps on `nodes` in-process nodes (node k logs to
  out/node{k}.jsonl and keeps its client state in out/node{k}, the server writes to
  out/server), through SecAgg+ when `secure`; the grid used. `again`: into the `out` of an
  earlier call, as a restarted federation (fresh nodes' contexts, a new ServerApp)."""
  config = out / 'config.json'
  out.mkdir(parents=True, exist_ok=again)
  config.write_text(config_io.to_json(cfg))
  num_clients = records.population(config_io.build(cfg).data)
  grid = LocalGrid({FIRST_NODE + k: SimpleNamespace(state=RecordDict(), node_config={
      'export-dir': str(export), 'config': str(config), 'log': str(out / f'node{k}.jsonl'),
      'clients': ','.join(map(str, clients)), 'state-dir': str(out / f'node{k}')})
      for k, clients in enumerate(clients_of_nodes(num_clients, nodes))}, lose_at, secure)
  server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                run_config={'export-dir': str(export), 'config': str(config),
                                            'out-dir': str(out / 'server'), 'rounds': rounds,
                                            'timeout': 60, 'secure-aggregation': int(secure)}))
  return grid
