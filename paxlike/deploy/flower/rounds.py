"""The server's side of an exported round, apart from Flower: what each slot is sent, and the
aggregation of the slots' contributions as the plan's communication section says."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from paxlike.export import run as executor


def client_state(plan: dict[str, Any]) -> list[str]:
  """The names of the state the plan carries at the clients, stacked by cohort slot (DiLoCo's
  inner optimizer state, SCAFFOLD's controls). The nodes keep it (client_state.py); the
  server keeps only each slot's version (slot_versions.py)."""
  return [s['name'] for s in plan['inputs'] if s['placement'] == 'clients' and s['carried']]


def server_state(plan: dict[str, Any], carried: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The carried state without the clients' (what the server keeps and checkpoints)."""
  kept_at_clients = set(client_state(plan))
  return {n: v for n, v in carried.items() if n not in kept_at_clients}


@dataclasses.dataclass(frozen=True)
class Draw:
  """A round's cohort (client id per slot, PADDED where none), the live clients it was drawn
  among (sorted), and whether its PADDED slots run the client program (`padded_slots_run`)."""

  cohort: np.ndarray
  live: list[int]
  padded_run: bool


def padded_slots_run(data: Any) -> bool:
  """Whether a PADDED slot runs the client program, as in the simulation: a Poisson cohort's
  unused slots do (mask 0, weight 0: their outputs enter the sums and means); under the other
  samplings a PADDED slot is one the deployment could not fill (fewer live clients than
  slots, a fixed slot whose client is lost), dropped as a straggler is."""
  return data.sampling == 'poisson'


def slots_by_node(cohort: np.ndarray, owner: dict[int, int], padded_run: bool
                  ) -> tuple[dict[int, list[int]], list[int]]:
  """({node: the cohort slots it runs}, the slots nobody runs). A slot goes to the node holding
  its client; a PADDED slot that runs (`padded_run`) to the node of the cohort's first client
  (the lowest node id when the cohort has none): its batch is all masked, drawn by the
  source's own padding rule."""
  from paxlike.data.sources import PADDED
  clients = [int(c) for c in cohort]
  first = next((owner[c] for c in clients if c in owner), min(owner.values(), default=None))
  by_node: dict[int, list[int]] = {}
  dropped = []
  for slot, client in enumerate(clients):
    node = owner.get(client) if client != PADDED else first if padded_run else None
    if node is None:
      dropped.append(slot)
    else:
      by_node.setdefault(node, []).append(slot)
  return by_node, dropped


def clients_of_nodes(population: int, nodes: int) -> list[list[int]]:
  """Node k's client ids: k, k + nodes, ... (every client on exactly one node)."""
  return [list(range(k, population, nodes)) for k in range(nodes)]


def rng_key_data(seed: int, step: int, key_impl: str) -> np.ndarray:
  """The round's key as uint32 data: the trainer's fold_in(key(seed), step)."""
  import jax
  key = jax.random.fold_in(jax.random.key(seed, impl=key_impl), step)
  return np.asarray(jax.random.key_data(key))


def slot_down(plan: dict[str, Any], env: dict[str, np.ndarray], slot: int,
              broadcasts: bool = True) -> dict[str, np.ndarray]:
  """What the server sends cohort slot `slot`: broadcasts whole (unless not `broadcasts`: a
  message then carries them once for all its slots, `shared_down`) and scatters their row
  `slot` (never client state: the nodes keep it)."""
  sent = {}
  for entry in plan['communication']:
    value = env[entry['value']] if entry['kind'] in executor.DOWN else None
    if entry['kind'] == 'broadcast' and broadcasts:
      sent[entry['value']] = value
    elif entry['kind'] == 'scatter':
      sent[entry['value']] = np.take(value, slot, axis=entry['axis'])
  return sent


def shared_down(plan: dict[str, Any], env: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The broadcasts a node's message carries once for all its slots, but for those the plan
  sends `once` (once.py)."""
  return {e['value']: env[e['value']] for e in plan['communication']
          if e['kind'] == 'broadcast' and not e.get('once')}


def aggregates(plan: dict[str, Any], contributions: list[dict[str, np.ndarray]]
               ) -> dict[str, np.ndarray]:
  """Each `sum`/`mean` result over the slots' contributions (in slot order), with the dtypes of
  federated_sum and federated_mean, as the reference executor reduces them."""
  results = {}
  for entry in plan['communication']:
    if entry['kind'] in executor.UP:
      stacked = np.stack([c[entry['value']] for c in contributions])
      dtype = str(stacked.dtype)
      results[entry['result']] = (
          np.sum(stacked, axis=0, dtype=executor._sum_dtype(dtype)) if entry['kind'] == 'sum'
          else np.mean(stacked.astype(executor._mean_dtype(dtype)), axis=0))
  return results


def program_args(spec: dict[str, Any], env: dict[str, np.ndarray]) -> list[np.ndarray]:
  return [env[d['name']] for d in spec['inputs']]


def named_outputs(spec: dict[str, Any], values: Any) -> dict[str, np.ndarray]:
  return {d['name']: np.asarray(v) for d, v in zip(spec['outputs'], values)}
