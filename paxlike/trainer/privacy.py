"""Privacy accounting of DP federated runs with Google's `dp_accounting` (RDP or PLD).

A DP run (an algorithm with a `dp.DpAggregator`) is client-level DP: one round is a Gaussian
mechanism on the sum of clipped client updates, noise multiplier z, over a cohort drawn from
a population of N clients (`population`: the clients the data source has, not the config
field `data.num_clients` that asks a partition for them). How the cohort is drawn decides the
accounting:

- 'poisson': each client joins with probability q = clients_per_round / N, what
  the data sources' 'poisson' sampling does (add/remove-one-client adjacency; RDP or PLD; the
  aggregator divides by the expected cohort qN, which `cohort_bound` gives it where the run's
  algorithm is built);
- 'without_replacement': exactly clients_per_round distinct clients, what the data sources'
  'uniform' sampling does (replace-one-client adjacency, N public: the clipped sum
  then has sensitivity 2C, so the accountant sees z/2; RDP only, Wang et al. 2019);
- 'full': every client every round (data sampling 'fixed'; add/remove-one, no amplification).

`dp_epsilon` at `dp_delta` (the aggregator's `delta`, default 1/N^1.1) is written at
every log step; a run whose whole schedule would spend more than `max_epsilon` is refused at
start. Size-weighted cohorts ('weighted' sampling) and pooled data (no clients) have no
client-level guarantee and are refused too.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING

from paxlike.errors import UserError
from paxlike.federated.dp import DpAggregator

SAMPLINGS = ('poisson', 'without_replacement', 'full')
DATA_SAMPLING = {'uniform': 'without_replacement', 'fixed': 'full',  # data.sampling -> ours.
                 'poisson': 'poisson'}

# dp_accounting pulls in scipy (about a second of start-up), so it is imported where it is used:
# only DP runs pay for it.
if TYPE_CHECKING:
  import dp_accounting


def round_event(noise_multiplier: float, sampling: str, clients_per_round: int,
                population: int) -> dp_accounting.DpEvent:
  """One round's DpEvent (see the module docstring for the three samplings)."""
  import dp_accounting
  if sampling == 'poisson':
    return dp_accounting.PoissonSampledDpEvent(
        clients_per_round / population, dp_accounting.GaussianDpEvent(noise_multiplier))
  if sampling == 'without_replacement':
    return dp_accounting.SampledWithoutReplacementDpEvent(
        population, clients_per_round, dp_accounting.GaussianDpEvent(noise_multiplier / 2))
  if sampling == 'full':
    return dp_accounting.GaussianDpEvent(noise_multiplier)
  raise UserError(f'dp sampling must be one of {", ".join(SAMPLINGS)}, got {sampling!r}')


def epsilon(event: dp_accounting.DpEvent, rounds: int, delta: float,
            accountant: str = 'rdp') -> float:
  """ε after `rounds` compositions of `event` at `delta` (z > 0)."""
  import dp_accounting
  if rounds == 0:
    return 0.0
  if accountant == 'pld':
    if isinstance(event, dp_accounting.SampledWithoutReplacementDpEvent):
      raise UserError("the pld accountant has no fixed-size cohorts (data.sampling='uniform'); "
                      "use accountant='rdp'")
    ledger = dp_accounting.pld.PLDAccountant()
  else:
    relation = (dp_accounting.NeighboringRelation.REPLACE_ONE
                if isinstance(event, dp_accounting.SampledWithoutReplacementDpEvent)
                else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    ledger = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
  return float(ledger.compose(event, rounds).get_epsilon(delta))


@dataclasses.dataclass(frozen=True)
class Accountant:
  """The privacy spent by a task's DP rounds: `epsilon(rounds)` at `delta`."""

  aggregator: DpAggregator
  sampling: str
  clients_per_round: int
  population: int  # The clients cohorts are drawn from (`population`).
  delta: float

  @functools.cached_property
  def event(self) -> dp_accounting.DpEvent:
    return round_event(self.aggregator.noise_multiplier, self.sampling, self.clients_per_round,
                       self.population)

  @functools.lru_cache(maxsize=None)
  def epsilon(self, rounds: int) -> float:
    """ε after `rounds` rounds (inf once a round without noise has run)."""
    if self.aggregator.noise_multiplier == 0:
      return math.inf if rounds else 0.0
    return epsilon(self.event, rounds, self.delta, self.aggregator.accountant)

  @property
  def sampling_rate(self) -> float:
    """q: the chance a given client is in a round (clients_per_round / population)."""
    return self.clients_per_round / self.population

  def describe(self, rounds: int) -> str:
    """One line: the ε `rounds` rounds spend, and what it is computed from."""
    cohort = (f'poisson sampling (q = {self.sampling_rate:.4g}) of {self.clients_per_round} '
              f'expected' if self.sampling == 'poisson' else
              f'{self.sampling} sampling of {self.clients_per_round}')
    return (f'dp: epsilon {self.epsilon(rounds):.4g} at delta {self.delta:.3g} after {rounds} '
            f'rounds ({self.aggregator.accountant}, {cohort} of {self.population} clients, '
            f'noise multiplier {self.aggregator.noise_multiplier:g})')


def aggregator_of(algorithm: object) -> DpAggregator | None:
  """The DP aggregator a built algorithm declares (`Algorithm.aggregator`), if any."""
  found = getattr(algorithm, 'aggregator', None)
  return found if isinstance(found, DpAggregator) else None


def population(task) -> int:
  """The number of clients cohorts are drawn from: the data's (`DataSource.client_sizes`),
  refusing data that has no clients."""
  if task.data.pooled:
    raise UserError('differential privacy needs clients: data.partition=pooled has none')
  return len(task.data.client_sizes)


def accountant(task) -> Accountant | None:
  """The task's accountant (None without DP). Raises UserError for a sampling that has no
  client-level guarantee or bad accounting settings. A query: it changes nothing."""
  aggregator = aggregator_of(task.built_algorithm)
  if aggregator is None:
    return None
  data = task.data
  if data.sampling not in DATA_SAMPLING:
    raise UserError(f'differential privacy needs uniform, Poisson or fixed cohorts, not '
                    f'data.sampling={data.sampling!r}')
  clients = population(task)
  expected_cohort(aggregator, data)  # Checks a configured divisor against the data's.
  aggregator.update_noise_multiplier(data.clients_per_round)  # Checks adaptive's noise split.
  delta = aggregator.delta if aggregator.delta is not None else clients**-1.1
  return Accountant(aggregator, DATA_SAMPLING[data.sampling], data.clients_per_round,
                    clients, delta)


def expected_cohort(aggregator: DpAggregator, data) -> float | None:
  """What `aggregator` divides the noised sum by in rounds of `data`: a Poisson cohort's
  expected size qN = data.clients_per_round (its padded slots are not the cohort), else the
  configured `expected_clients` (None: the round's slots). UserError when a value set in the
  config differs from the Poisson cohort's."""
  if data.sampling != 'poisson':
    return aggregator.expected_clients
  expected = data.clients_per_round
  if aggregator.expected_clients not in (None, expected):
    raise UserError(f'dp expected_clients={aggregator.expected_clients:g} but a Poisson cohort '
                    f'expects data.clients_per_round={expected}: leave it unset')
  return expected


def cohort_bound(task):
  """`task` with its DP aggregator's divisor set to `expected_cohort` of its data, so the
  algorithm built from it (the compiled round, the export) divides by the cohort it will
  meet; `task` itself when that is already so (or without DP). The aggregator is built with
  the algorithm's config, before the data it will meet, so this is where the two meet."""
  aggregator = aggregator_of(task.built_algorithm)
  if aggregator is None:
    return task
  expected = expected_cohort(aggregator, task.data)
  if aggregator.expected_clients == expected:
    return task
  builder = task.algorithm
  if not (isinstance(builder, functools.partial)
          and builder.keywords.get('aggregator') is aggregator):
    raise UserError(f'dp under Poisson sampling divides by the expected cohort: set the '
                    f"aggregator's expected_clients={expected} (data.clients_per_round)")
  bound = dataclasses.replace(aggregator, expected_clients=expected)
  return dataclasses.replace(task, algorithm=functools.partial(builder, aggregator=bound))


def checked_accountant(task) -> Accountant | None:
  """`accountant(task)`, refusing (UserError) a run whose `train.num_steps` rounds would spend
  more than the aggregator's `max_epsilon`."""
  acc, rounds = accountant(task), task.train.num_steps
  limit = None if acc is None else acc.aggregator.max_epsilon
  if limit is not None and acc.epsilon(rounds) > limit:
    raise UserError(f'this run would spend epsilon {acc.epsilon(rounds):.4g} > max_epsilon '
                    f'{limit:g} at delta {acc.delta:.3g} over {rounds} rounds; raise '
                    f'the noise multiplier or train fewer rounds')
  return acc


def round_metrics(acc: Accountant | None, step: int) -> dict[str, float]:
  """`dp_epsilon` and `dp_delta` after `step` rounds (nothing without DP), and under Poisson
  sampling `dp_poisson_rate`, the q that ε assumes."""
  if acc is None:
    return {}
  poisson = {'dp_poisson_rate': acc.sampling_rate} if acc.sampling == 'poisson' else {}
  return {'dp_epsilon': acc.epsilon(step), 'dp_delta': acc.delta, **poisson}
