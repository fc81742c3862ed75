"""The round options every federated algorithm builder takes, with the same meaning in each.

- `client_chunk`: clients trained at a time (`federated_map(chunk=)`); None: the platform's
  default, which `chunking.resolve_client_chunk` picks (the one place) while a round is traced.
- `aggregator`: how client updates become the server's update (None: their weighted mean;
  `dp.DpAggregator`: clipped and noised). The built `Algorithm` declares it, for the privacy
  accountant.
- `prox_mu`: FedProx's proximal weight on each client's local objective (0: none).

An algorithm for which an option has no meaning accepts the keyword and refuses any value but
the default, in one line (`refuse_options`).
"""

from __future__ import annotations

from typing import Any

from paxlike.trainer.algorithm import AlgorithmConfigError


def check_prox_mu(prox_mu: float) -> float:
  if isinstance(prox_mu, bool) or not isinstance(prox_mu, (int, float)) or prox_mu < 0:
    raise AlgorithmConfigError(f'prox_mu must be a number >= 0, got {prox_mu!r}.')
  return prox_mu


def refuse_options(algorithm: str, why: str, aggregator: Any = None,
                   prox_mu: float = 0.0) -> None:
  """Raises AlgorithmConfigError naming the first option `algorithm` cannot honour (`why`)."""
  if aggregator is not None:
    raise AlgorithmConfigError(f'{algorithm} takes no aggregator ({why}), got {aggregator!r}.')
  if check_prox_mu(prox_mu):
    raise AlgorithmConfigError(f'{algorithm} takes no prox_mu ({why}), got {prox_mu!r}.')
