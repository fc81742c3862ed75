"""The bases paxlike/experiments/federated.py builds its experiments from (it registers nothing):
ROUNDS rounds logged, evaluated and checkpointed as EVERY says; `Federated` assembles a task
from class attributes; `Shakespeare` and `Digits` fix a data set and its model."""

from typing import Any

import fiddle as fdl

from paxlike.configs import federated as fed
from paxlike.configs import models, optimizers, tasks
from paxlike.data import ImageData, LmData
from paxlike.experiment import Experiment

ROUNDS = 100
EVERY = dict(log_every=10, eval_every=25, checkpoint_every=25)
DOMAINS = dict(partition='domains', num_clients=4, sampling='fixed')  # 4 runs of roles, fixed.


class Federated(Experiment):
  """ROUNDS rounds of ALGORITHM (a paxlike.configs.federated preset) with ALGORITHM_ARGS; COHORT =
  (argument, n): a fixed-cohort algorithm's count, n clients per round; round options PROX_MU
  and DP (`fed.dp_adaptive`'s arguments: the DP aggregator). The model is MODEL() with
  MODEL_FIELDS, the clients' optimizer OPTIMIZER(*OPTIMIZER_ARGS), DATA the data's fields."""
  ALGORITHM, ALGORITHM_ARGS, COHORT, PROX_MU, DP = 'fed_avg', {}, None, None, None
  MODEL, MODEL_FIELDS = staticmethod(models.lm_tiny), {}
  OPTIMIZER, OPTIMIZER_ARGS = staticmethod(optimizers.constant_adamw), (3e-3,)
  DATA: dict[str, Any] = {}

  def algorithm(self) -> fdl.Partial:
    cfg = getattr(fed, self.ALGORITHM)(**dict([self.COHORT] if self.COHORT else []),
                                       **self.ALGORITHM_ARGS)
    if self.PROX_MU:
      cfg.prox_mu = self.PROX_MU
    if self.DP:
      cfg.aggregator = fed.dp_adaptive(**self.DP)
    return cfg

  def model(self) -> fdl.Config:
    cfg = self.MODEL()
    for name, value in self.MODEL_FIELDS.items():
      setattr(cfg, name, value)
    return cfg

  def data_fields(self) -> dict[str, Any]:
    cohort = {'clients_per_round': self.COHORT[1]} if self.COHORT else {}
    return {**cohort, **self.DATA}

  def task(self):
    return tasks.task(self.model(), self.algorithm(), self.OPTIMIZER(*self.OPTIMIZER_ARGS),
                      ROUNDS, **EVERY)


class Shakespeare(Federated):
  """The 2-layer byte LM (100 rounds: minutes on 2 CPU cores) on Tiny Shakespeare by speaking
  role, 64-byte windows, 8 per client batch, 8 roles a round, 4 local steps unless DATA says
  otherwise; the clients' AdamW at constant lr 3e-3."""
  DATA = dict(clients_per_round=8, local_steps=4)

  def datasets(self):
    return fdl.Config(LmData, **{'dataset': 'shakespeare', 'partition': 'natural', 'seq_len': 64,
                                 'batch_size': 8, **self.data_fields()})


class Digits(Federated):
  """scikit-learn's digits with Dirichlet(α = 0.3) label skew over DATA's clients, an MLP, 5
  local SGD steps (lr 0.1) of batch 16."""
  MODEL, OPTIMIZER, OPTIMIZER_ARGS = (staticmethod(models.mlp), staticmethod(optimizers.sgd),
                                      (0.1,))

  def datasets(self):
    return fdl.Config(ImageData, dataset='digits', partition='dirichlet', alpha=0.3,
                      local_steps=5, batch_size=16, **self.data_fields())
