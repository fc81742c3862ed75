"""Federated task building blocks: algorithms, client optimizers and the task they make.

One cohort, one home. A round's cohort shape (clients per round × local steps) is read by the
data (to make the batches) and by some algorithms (to check or keep per-client state), so it
is set in exactly one place, and `matched_task` copies it into the other when the task is
built:
- `algorithm.local_steps` (FedAvg/FedOpt/DiLoCo) and `algorithm.num_replicas` (DiLoCo),
  `.population` (PAPA), `.num_experts` (BTM) are the truth where the algorithm has them;
- otherwise `data.local_steps` (PAPA, BTM) and `data.clients_per_round` (FedAvg/FedOpt) are.
The data config is a `fdl.Partial`, so the fields it sets explicitly are known: setting a
derived one (say `--fdl_set=data.local_steps=8` under FedAvg) to a different value is a
one-line UserError naming the field to set instead.
"""

import functools
from typing import Any

import fiddle as fdl
import optax

from configs import meshes, optimizers, tasks
from paxlike import federated, optim
from paxlike.errors import UserError
from paxlike.experiment import Task, TrainConfig
from paxlike.federated import scaffold as scaffold_lib
from paxlike.partitioning import MeshConfig

# Algorithm argument -> the data field it determines.
COHORT_ARGS = {'local_steps': 'local_steps', 'num_replicas': 'clients_per_round',
               'population': 'clients_per_round', 'num_experts': 'clients_per_round',
               'num_clients': 'clients_per_round'}


def matched_task(model: Any, optimizer: optax.GradientTransformation, algorithm: Any,
                 data: Any, mesh: MeshConfig = MeshConfig(),
                 train: TrainConfig = TrainConfig()) -> Task:
  """A Task whose data cohort matches its algorithm (see the module docstring). `data` is a
  partial DataSource (its cohort fields are filled in) or a built one (they are checked)."""
  derived = {}
  for arg, field in COHORT_ARGS.items():
    value = getattr(algorithm, 'keywords', {}).get(arg)
    if value is None:
      continue
    given = (data.keywords.get(field, value) if isinstance(data, functools.partial)
             else getattr(data, field))
    if given != value:
      raise UserError(f'data.{field}={given} disagrees with algorithm.{arg}={value}; '
                      f'set algorithm.{arg} only')
    derived[field] = value
  if isinstance(data, functools.partial):
    data = data(**derived)
  if 'num_clients' in getattr(algorithm, 'keywords', {}) and data.sampling != 'fixed':
    raise UserError(f"scaffold keeps every client's control variate, so it trains every client "
                    f"every round: set data.sampling='fixed', not {data.sampling!r}")
  return Task(model=model, optimizer=optimizer, algorithm=algorithm, data=data, mesh=mesh,
              train=train)


def federated_task(model: fdl.Config, algorithm: fdl.Partial, client_optimizer: fdl.Config,
                   num_rounds: int, **train: int) -> fdl.Config[Task]:
  """A federated task on a data-parallel mesh; `train` sets log/eval/checkpoint intervals."""
  return fdl.Config(matched_task, model=model, optimizer=client_optimizer, algorithm=algorithm,
                    data=None, mesh=meshes.data_parallel(),
                    train=tasks.train_config(num_rounds, **train))


def fed_avg(local_steps: int, server_learning_rate: float = 1.0,
            weighting: str = 'num_examples') -> fdl.Partial:
  """FedAvg; server SGD at lr 1 is plain weighted model averaging. `weighting`: how clients
  count (paxlike.algorithm.WEIGHTINGS)."""
  return fdl.Partial(federated.fed_avg, local_steps=local_steps,
                     server_optimizer=optimizers.sgd(server_learning_rate), weighting=weighting)


def fed_avgm(local_steps: int, server_learning_rate: float = 1.0,
             server_momentum: float = 0.9) -> fdl.Partial:
  """FedAvgM (Hsu et al. 2019): FedAvg with server momentum, SGD(lr 1, β 0.9) on the
  pseudo-gradient."""
  return fdl.Partial(federated.fed_avg, local_steps=local_steps,
                     server_optimizer=optimizers.sgd(server_learning_rate, server_momentum))


def fed_adam(local_steps: int, server_learning_rate: float = 1e-2, tau: float = 1e-3,
             flavour: str = 'paper') -> fdl.Partial:
  """FedAdam (Reddi et al. 2021), β1 = 0.9, β2 = 0.99; `flavour='paper'` is their Algorithm 2,
  `'optax'` is optax.adam (bias-corrected, v from 0)."""
  return fdl.Partial(federated.fed_adam, local_steps=local_steps,
                     server_learning_rate=server_learning_rate, tau=tau, flavour=flavour)


def fed_yogi(local_steps: int, server_learning_rate: float = 1e-2, tau: float = 1e-3,
             flavour: str = 'paper') -> fdl.Partial:
  """FedYogi (Reddi et al. 2021), β1 = 0.9, β2 = 0.99."""
  return fdl.Partial(federated.fed_yogi, local_steps=local_steps,
                     server_learning_rate=server_learning_rate, tau=tau, flavour=flavour)


def fed_adagrad(local_steps: int, server_learning_rate: float = 1e-2, tau: float = 1e-3,
                flavour: str = 'paper') -> fdl.Partial:
  """FedAdagrad (Reddi et al. 2021), server momentum β1 = 0.9 (paper flavour)."""
  return fdl.Partial(federated.fed_adagrad, local_steps=local_steps,
                     server_learning_rate=server_learning_rate, tau=tau, flavour=flavour)


def diloco(local_steps: int, num_replicas: int, outer_learning_rate: float = 0.7,
           outer_momentum: float = 0.9) -> fdl.Partial:
  """DiLoCo with the paper's outer Nesterov SGD; the inner optimizer is the task's."""
  outer = fdl.Config(optim.sgd, learning_rate=outer_learning_rate, momentum=outer_momentum,
                     nesterov=True)
  return fdl.Partial(federated.diloco, local_steps=local_steps, num_replicas=num_replicas,
                     outer_optimizer=outer)


def papa(population: int, alpha: float = 0.99, every: int = 10, variant: str = 'gradual',
         same_init: bool = False) -> fdl.Partial:
  """PAPA, averaging every `every` rounds: every × local_steps SGD steps (local steps come from
  the data; the paper's periods are in paxlike/federated/papa.py). Members start from their own
  random inits unless `same_init`."""
  return fdl.Partial(federated.papa, population=population, alpha=alpha, every=every,
                     variant=variant, same_init=same_init)


def btm(num_experts: int, seed_steps: int = 0) -> fdl.Partial:
  """Branch-train-merge: experts branched from the initial params (after `seed_steps` rounds of
  seed training on the pooled domains), merged by example counts."""
  return fdl.Partial(federated.btm, num_experts=num_experts, seed_steps=seed_steps)


def scaffold(local_steps: int, num_clients: int, server_learning_rate: float = 1.0) -> fdl.Partial:
  """SCAFFOLD over a fixed population (data sampling 'fixed', every client every round)."""
  return fdl.Partial(scaffold_lib.scaffold, local_steps=local_steps, num_clients=num_clients,
                     server_optimizer=optimizers.sgd(server_learning_rate))
