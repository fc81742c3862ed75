"""The plan's sums through Flower's SecAgg+ (`--secure_aggregation`): the server learns only the
sum over the nodes of their contributions, never one node's.

Flower 1.42 has SecAgg+ only on its legacy path: `SecAggPlusWorkflow` driving a strategy's
`configure_fit`/`aggregate_fit`, and the nodes' `secaggplus_mod` around a handler that answers
a legacy fit message (parameters: a list of arrays). Each node sends the sum over its slots of
every summed or averaged value, divided by that value's scale (`value_scales`, which the server
knows too) so that it lies in ±CLIPPING_RANGE: a weighted sum's is the cohort's total weight (at
least 1), a plain mean's the cohort's number of slots (a mean of the clients' learning rates
divided by a total weight of thousands of tokens would fall below one level). The mod quantizes
each value stochastically to QUANTIZATION_RANGE levels over that range and masks it; the server
unmasks only the sum over the nodes (of their mean: times the nodes). Each node's value is off
by less than one level, so a summed value differs from the exact sum by less than
nodes × 2 × CLIPPING_RANGE / QUANTIZATION_RANGE × scale (`sum_error_bound`). A node whose
scaled value leaves the range refuses the round in one line instead of being clipped. A 0-d
value travels as shape (1,): the workflow's unmasking adds its offset and divides in place,
which leaves a 0-d array's result unchanged (checked in tests/deploy/test_flower_secure.py). Every
admitted node takes part in every round (with zeros when it serves no slot), so the server
cannot tell a node's contribution even when the cohort falls on one node.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from paxlike.export import run as executor

CLIPPING_RANGE = 64.0  # Flower's 8 clips DP-FedAvg's scaled stats (docs/flower.md, SecAgg+).
QUANTIZATION_RANGE = 2**27  # One level: 128 / 2^27 ≈ 9.5e-7 of the scaled value.
MODULUS_RANGE = 2**32
MAX_NODES = MODULUS_RANGE // QUANTIZATION_RANGE - 1  # The modular sum cannot wrap: 31.
# With 2 nodes each learns the other's contribution: the sum (the next round's model) less its own.
MIN_NODES = 3


def nodes_refusal(nodes: int) -> str | None:
  """Why SecAgg+ over `nodes` nodes would not hide a node's contribution or could not sum
  (one line naming --nodes and what to pass); None for MIN_NODES to MAX_NODES."""
  if nodes < MIN_NODES:
    return (f'--secure_aggregation with --nodes={nodes} hides nothing: the sum less a node\'s '
            'own contribution is the other\'s' if nodes == 2 else
            f'--secure_aggregation with --nodes={nodes} has no one to hide a node among'
            ) + f'; pass --nodes={MIN_NODES} or more'
  if nodes > MAX_NODES:
    return (f'--secure_aggregation with --nodes={nodes}: SecAgg+\'s modular sum would wrap; '
            f'pass --nodes={MAX_NODES} or fewer')
  return None


def refusal(plan: dict[str, Any]) -> str | None:
  """Why SecAgg+ cannot run `plan` (one line): a client output its server or its clients read
  one client at a time instead of summed; None when every contribution is summed or averaged."""
  uplinked = {e['value'] for e in plan['communication'] if e['kind'] in executor.UP}
  single = [d['name'] for d in plan['programs']['client']['outputs'] if d['name'] not in uplinked]
  if single:
    return (f'--secure_aggregation: {plan.get("algorithm", "this algorithm")} keeps each '
            f'client\'s {single[0]} individually, and SecAgg+ reveals only sums')
  return None


def summed_values(plan: dict[str, Any]) -> list[str]:
  """The client outputs that go up (each once, in plan order): what a node sends."""
  names: list[str] = []
  for entry in plan['communication']:
    if entry['kind'] in executor.UP and entry['value'] not in names:
      names.append(entry['value'])
  return names


def value_scales(plan: dict[str, Any], weight: float, slots: int) -> dict[str, float]:
  """Per summed value, what a node divides it by: the cohort's number of `slots` for a value
  only averaged, else the cohort's total `weight` (each at least 1)."""
  kinds: dict[str, set[str]] = {}
  for entry in plan['communication']:
    if entry['kind'] in executor.UP:
      kinds.setdefault(entry['value'], set()).add(entry['kind'])
  return {name: float(max(1, slots)) if kinds[name] == {'mean'} else max(1.0, float(weight))
          for name in summed_values(plan)}


def sum_error_bound(nodes: int, scale: float) -> float:
  """The most a SecAgg+ sum of `nodes` nodes' values differs from the exact sum."""
  return nodes * 2 * CLIPPING_RANGE / QUANTIZATION_RANGE * scale


def node_sum(plan: dict[str, Any], contributions: list[dict[str, np.ndarray]],
             scales: dict[str, float]) -> list[np.ndarray]:
  """What a node sends: per summed value, its slots' sum (zeros when it has none) / its scale
  (`value_scales`), in float64; ValueError (one line) when a value leaves ±CLIPPING_RANGE."""
  specs = {d['name']: d for d in plan['programs']['client']['outputs']}
  out = []
  for name in summed_values(plan):
    total = np.zeros(specs[name]['shape'], np.float64)
    for c in contributions:
      total = total + np.asarray(c[name], np.float64)
    scaled = total / scales[name]
    if scaled.size and np.max(np.abs(scaled)) > CLIPPING_RANGE:
      raise ValueError(f'{name} / {scales[name]:g} reaches {np.max(np.abs(scaled)):.3g}, '
                       f'outside SecAgg+\'s clipping range ±{CLIPPING_RANGE:g}')
    out.append(np.atleast_1d(scaled))  # The workflow's unmasking skips 0-d arrays.
  return out


def aggregates(plan: dict[str, Any], sums: list[np.ndarray], slots: int,
               scales: dict[str, float]) -> dict[str, np.ndarray]:
  """The plan's aggregates from the unmasked per-value sums (scaled back by `scales`, as the
  executor's dtypes; a mean divides by the `slots` that contributed)."""
  specs = {d['name']: d for d in plan['programs']['client']['outputs']}
  total = dict(zip(summed_values(plan), sums))
  results = {}
  for entry in plan['communication']:
    if entry['kind'] not in executor.UP:
      continue
    dtype = specs[entry['value']]['dtype']
    shape = specs[entry['value']]['shape']
    value = np.asarray(total[entry['value']], np.float64).reshape(shape) * scales[entry['value']]
    if entry['kind'] == 'mean':
      results[entry['result']] = (value / slots).astype(executor._mean_dtype(dtype))
    else:
      wide = executor._sum_dtype(dtype)
      exact = np.issubdtype(np.dtype(wide), np.integer)
      results[entry['result']] = (np.rint(value) if exact else value).astype(wide)
  return results


def fit_config(step: int, slots: list[int], clients: list[int], live: list[int],
               scales: dict[str, float], keys: list[str]) -> dict[str, Any]:
  """A legacy fit message's config (scalars only): the round, the node's slots and their
  clients, the live clients the cohort was drawn among, the values' scales and the names of
  the parameter list's arrays."""
  return {'step': step, 'slots': json.dumps(slots), 'clients': json.dumps(clients),
          'live': json.dumps(live), 'scales': json.dumps(scales), 'keys': json.dumps(keys)}


def read_fit_config(config: dict[str, Any]
                    ) -> tuple[int, list[int], list[int], list[int], dict[str, float], list[str]]:
  """(step, slots, clients, live, scales, keys) of `fit_config`."""
  return (int(config['step']), json.loads(str(config['slots'])),
          json.loads(str(config['clients'])), json.loads(str(config['live'])),
          json.loads(str(config['scales'])), json.loads(str(config['keys'])))

