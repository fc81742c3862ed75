"""The round options every federated algorithm builder takes, with the same meaning in each.

- `client_chunk`: clients trained at a time (`federated_map(chunk=)`); None: the platform's
  default, which `chunking.resolve_client_chunk` picks (the one place) while a round is traced.
- `aggregator`: how client updates become the server's update (None: their weighted mean;
  `dp.DpAggregator`: clipped and noised). The built `Algorithm` declares it, for the privacy
  accountant.
- `prox_mu`: FedProx's proximal weight on each client's local objective (0: none).
- `drop_stragglers` (the pseudo-gradient algorithms: FedAvg, FedOpt, DiLoCo): what the server
  does with a straggler's partial work (the data's `straggler_fraction`): True gives it weight
  0 in the aggregate (FedAvg's baseline in Li et al. 2020), False keeps it; None, the default,
  is the paper's pairing: dropped unless `prox_mu` > 0 (FedProx keeps it). The algorithms
  whose state is per slot (PAPA, BTM, SCAFFOLD) refuse stragglers (algorithm.cohort_size).

The builders take them as keywords (what a config sets, `algorithm.prox_mu=...`) and pass them
on as one checked record (`RoundOptions`). An algorithm for which an option has no meaning
accepts the keyword and refuses any value but the default, in one line (`refuse_options`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from paxlike.core.algorithm import AlgorithmConfigError, check_weighting


class RoundOptions(NamedTuple):
  """The round options of a builder (see the module doc), checked (`round_options`)."""

  client_chunk: int | None = None
  weighting: str = 'num_examples'
  aggregator: Any = None
  prox_mu: float = 0.0
  drop_stragglers: bool | None = None

  @property
  def drops_stragglers(self) -> bool:
    """Whether stragglers' partial work is dropped (`drop_stragglers_of`)."""
    return drop_stragglers_of(self.drop_stragglers, self.prox_mu)


def round_options(client_chunk: int | None = None, weighting: str = 'num_examples',
                  aggregator: Any = None, prox_mu: float = 0.0,
                  drop_stragglers: bool | None = None) -> RoundOptions:
  """The options as one record, after an AlgorithmConfigError for a bad weighting, prox_mu or
  drop_stragglers."""
  check_prox_mu(prox_mu)
  check_weighting(weighting)
  drop_stragglers_of(drop_stragglers, prox_mu)  # Refuses what is not True, False or None.
  return RoundOptions(client_chunk, weighting, aggregator, prox_mu, drop_stragglers)


def check_prox_mu(prox_mu: float) -> float:
  if isinstance(prox_mu, bool) or not isinstance(prox_mu, (int, float)) or prox_mu < 0:
    raise AlgorithmConfigError(f'prox_mu must be a number >= 0, got {prox_mu!r}.')
  return prox_mu


def drop_stragglers_of(drop_stragglers: bool | None, prox_mu: float) -> bool:
  """Whether stragglers' partial work is dropped: `drop_stragglers`, or unset (None) unless
  FedProx (`prox_mu` > 0)."""
  if drop_stragglers is None:
    return not prox_mu
  if not isinstance(drop_stragglers, bool):
    raise AlgorithmConfigError(f'drop_stragglers must be True, False or None (drop unless '
                               f'prox_mu > 0), got {drop_stragglers!r}.')
  return drop_stragglers


def refuse_options(algorithm: str, why: str, aggregator: Any = None,
                   prox_mu: float = 0.0) -> None:
  """Raises AlgorithmConfigError naming the first option `algorithm` cannot honour (`why`)."""
  if aggregator is not None:
    raise AlgorithmConfigError(f'{algorithm} takes no aggregator ({why}), got {aggregator!r}.')
  if check_prox_mu(prox_mu):
    raise AlgorithmConfigError(f'{algorithm} takes no prox_mu ({why}), got {prox_mu!r}.')
