"""Federated algorithm presets, as `fdl.Partial`s for `paxlike.configs.tasks.task(algorithm=...)`.

The data config alone sets a round's shape: `data.clients_per_round` clients, each running
`data.local_steps` local steps; the algorithms read both from the batches. Fixed-cohort
algorithms also keep their count (DiLoCo's `num_replicas`, PAPA's `population`, BTM's
`num_experts`, SCAFFOLD's `num_clients`), since their state has one slice per cohort slot;
building the Task checks it equals `data.clients_per_round` (`paxlike.trainer.task`).
"""

import fiddle as fdl

from paxlike.configs import optimizers
from paxlike import federated
from paxlike.core import optim
from paxlike.federated import scaffold as scaffold_lib
from paxlike.federated.dp import DpAggregator


def fed_avg(server_learning_rate: float = 1.0, weighting: str = 'num_examples') -> fdl.Partial:
  """FedAvg; server SGD at lr 1 is plain weighted model averaging. `weighting`: how clients
  count (paxlike.core.algorithm.WEIGHTINGS)."""
  return fdl.Partial(federated.fed_avg, server_optimizer=optimizers.sgd(server_learning_rate),
                     weighting=weighting)


def fed_avgm(server_learning_rate: float = 1.0, server_momentum: float = 0.9) -> fdl.Partial:
  """FedAvgM (Hsu et al. 2019): FedAvg with server momentum, SGD(lr 1, β 0.9) on the
  pseudo-gradient."""
  return fdl.Partial(federated.fed_avg,
                     server_optimizer=optimizers.sgd(server_learning_rate, server_momentum))


def fed_adam(server_learning_rate: float = 1e-2, tau: float = 1e-3,
             flavour: str = 'paper') -> fdl.Partial:
  """FedAdam (Reddi et al. 2021), β1 = 0.9, β2 = 0.99; `flavour='paper'` is their Algorithm 2,
  `'optax'` is optax.adam (bias-corrected, v from 0)."""
  return fdl.Partial(federated.fed_adam, server_learning_rate=server_learning_rate, tau=tau,
                     flavour=flavour)


def fed_yogi(server_learning_rate: float = 1e-2, tau: float = 1e-3,
             flavour: str = 'paper') -> fdl.Partial:
  """FedYogi (Reddi et al. 2021), β1 = 0.9, β2 = 0.99."""
  return fdl.Partial(federated.fed_yogi, server_learning_rate=server_learning_rate, tau=tau,
                     flavour=flavour)


def fed_adagrad(server_learning_rate: float = 1e-2, tau: float = 1e-3,
                flavour: str = 'paper') -> fdl.Partial:
  """FedAdagrad (Reddi et al. 2021), server momentum β1 = 0.9 (paper flavour)."""
  return fdl.Partial(federated.fed_adagrad, server_learning_rate=server_learning_rate, tau=tau,
                     flavour=flavour)


def diloco(num_replicas: int, outer_learning_rate: float = 0.7,
           outer_momentum: float = 0.9) -> fdl.Partial:
  """DiLoCo with the paper's outer Nesterov SGD; the inner optimizer is the task's."""
  outer = fdl.Config(optim.sgd, learning_rate=outer_learning_rate, momentum=outer_momentum,
                     nesterov=True)
  return fdl.Partial(federated.diloco, num_replicas=num_replicas, outer_optimizer=outer)


def papa(population: int, alpha: float = 0.99, every: int = 10, variant: str = 'gradual',
         same_init: bool = False) -> fdl.Partial:
  """PAPA, averaging every `every` rounds: every × data.local_steps SGD steps (the paper's
  periods are in paxlike/federated/papa.py). Members start from their own
  random inits unless `same_init`."""
  return fdl.Partial(federated.papa, population=population, alpha=alpha, every=every,
                     variant=variant, same_init=same_init)


def btm(num_experts: int, seed_steps: int = 0) -> fdl.Partial:
  """Branch-train-merge: experts branched from the initial params (after `seed_steps` rounds of
  seed training on the pooled domains), merged by example counts."""
  return fdl.Partial(federated.btm, num_experts=num_experts, seed_steps=seed_steps)


def scaffold(num_clients: int, server_learning_rate: float = 1.0) -> fdl.Partial:
  """SCAFFOLD over a fixed population (data sampling 'fixed', every client every round)."""
  return fdl.Partial(scaffold_lib.scaffold, num_clients=num_clients,
                     server_optimizer=optimizers.sgd(server_learning_rate))


def dp_adaptive(clip_norm: float, noise_multiplier: float, **kwargs) -> fdl.Config[DpAggregator]:
  """DP aggregation with adaptive clipping to the median update norm (Andrew et al. 2021), for
  a pseudo-gradient algorithm's `aggregator`. The count noise σ_b = z (the paper's cohort/20 is
  too little for cohorts of 20): the update sum then gets noise 1.15·z·C, so that both releases
  together cost exactly z."""
  return fdl.Config(DpAggregator, clip_norm=clip_norm, noise_multiplier=noise_multiplier,
                    target_quantile=0.5, count_stddev=noise_multiplier, **kwargs)
