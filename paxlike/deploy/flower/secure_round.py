"""One round's uplink through Flower's SecAgg+ workflow (secure.py says what it computes): a
strategy that gives each node its slots' values and keeps the unmasked sum, driven by
`SecAggPlusWorkflow` over the run's Grid."""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.common import FitIns, FitRes, Parameters, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.server_config import ServerConfig
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key
from flwr.serverapp import Grid

from paxlike.deploy.flower import secure


class _Sums(Strategy):
  """configure_fit: every node its own FitIns; aggregate_fit: keeps the workflow's unmasked
  mean over the nodes (the workflow puts it in every result's parameters)."""

  def __init__(self, fitins: dict[int, FitIns]):
    self.fitins, self.mean, self.nodes = fitins, None, 0

  def initialize_parameters(self, client_manager: Any) -> Parameters | None:
    return None

  def configure_fit(self, server_round: int, parameters: Parameters, client_manager: Any
                    ) -> list[tuple[ClientProxy, FitIns]]:
    proxies = client_manager.all()
    return [(proxies[str(node)], fitins) for node, fitins in self.fitins.items()]

  def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                    failures: list[Any]) -> tuple[Parameters | None, dict]:
    if results and not failures:
      self.mean, self.nodes = parameters_to_ndarrays(results[0][1].parameters), len(results)
    return None, {}

  def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: Any
                         ) -> list:
    return []

  def aggregate_evaluate(self, server_round: int, results: list, failures: list
                         ) -> tuple[None, dict]:
    return None, {}

  def evaluate(self, server_round: int, parameters: Parameters) -> None:
    return None


class Halted(RuntimeError):
  """SecAgg+ stopped before the sum: a node failed, left or did not answer in time."""


def secure_sums(grid: Grid, context: Context,
                by_node: dict[int, tuple[list[int], list[int], dict[str, np.ndarray]]],
                live: list[int], step: int, scales: dict[str, float], timeout: float
                ) -> tuple[list[np.ndarray], int]:
  """(The sum over the nodes of what each sends (secure.node_sum), the bytes of the arrays
  sent down), each node given its (slots, clients, values sent down, by record key) of round
  `step` and the `live` clients the cohort was drawn among; `Halted` (one line) when
  SecAgg+ halts."""
  fitins = {}
  for node, (slots, clients, down) in by_node.items():
    keys = list(down)
    fitins[node] = FitIns(ndarrays_to_parameters([np.asarray(down[k]) for k in keys]),
                          secure.fit_config(step, slots, clients, live, scales, keys))
  manager = SimpleClientManager()
  for node in by_node:
    manager.register(GridClientProxy(node, grid, context.run_id))
  strategy = _Sums(fitins)
  legacy = LegacyContext(context, config=ServerConfig(num_rounds=1), strategy=strategy,
                         client_manager=manager)
  legacy.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({Key.CURRENT_ROUND: step})
  legacy.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
  workflow = SecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=1.0,
                                max_weight=1.0, clipping_range=secure.CLIPPING_RANGE,
                                quantization_range=secure.QUANTIZATION_RANGE,
                                modulus_range=secure.MODULUS_RANGE, timeout=timeout)
  workflow(grid, legacy)
  if strategy.mean is None:
    raise Halted(f'round {step}: SecAgg+ halted (a node failed or did not answer; '
                 'see the ServerApp log)')
  sent = sum(len(t) for f in fitins.values() for t in f.parameters.tensors)
  return [np.asarray(m, np.float64) * strategy.nodes for m in strategy.mean], sent
