"""The task a run executes (`Task`): model, optimizer, algorithm, data, mesh and loop settings
(`TrainConfig`), as `fdl.build` makes it from an experiment's config.

Building it completes the model from the data and checks the two agree (its family's `complete`
and `check_data`: e.g. an LM's vocab_size). The data alone says a round's shape
(`data.clients_per_round` × `data.local_steps`); the algorithms read it from the batches.
Algorithms whose state has one slice per cohort slot declare that count
(`Algorithm.fixed_cohort`), and building the Task checks the two agree.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import optax

from paxlike.core.algorithm import Algorithm, AlgorithmBuilder
from paxlike.core.partitioning import MeshConfig
from paxlike.data.sources import DataSource
from paxlike.errors import UserError
from paxlike.families import family_of
from paxlike.trainer.objectives import task_loss_fn


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Loop settings. Steps are rounds for federated algorithms."""

  num_steps: int = 1000
  log_every: int = 50
  eval_every: int = 200
  checkpoint_every: int = 200
  seed: int = 0
  max_to_keep: int = 3
  skip_nonfinite: bool = False  # Skip (and count) non-finite steps instead of failing.
  personalize_steps: int | None = None  # Eval: also score each client after k local steps.
  # Start a fresh run from 'hf:DIR' (a Hugging Face Llama dir) or 'job:DIR[@STEP]' (another
  # job's params); a resumed run uses its own checkpoints. See paxlike/trainer/init_from.py.
  init_from: str | None = None
  ema_decay: float | None = None  # Keep an EMA of the params (eval_ema_*, export); None: off.
  # GPipe microbatches per step on a mesh with a 'stage' axis (docs/pipeline.md); gradient
  # accumulation over data.local_steps is separate and unchanged.
  microbatches: int = 1
  # Bytes per device a train step may use, in GB; None: the device's own limit where JAX reports
  # one (TPU, GPU; XLA:CPU reports none). A step that needs more is refused before step 1.
  memory_budget_gb: float | None = None

  def __post_init__(self):
    for name in ('num_steps', 'log_every', 'eval_every', 'checkpoint_every', 'max_to_keep',
                 'microbatches'):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UserError(f'train.{name} must be a positive integer, got {value!r}')
    if self.personalize_steps is not None and (
        not isinstance(self.personalize_steps, int) or self.personalize_steps < 0):
      raise UserError(f'train.personalize_steps must be None or an integer >= 0, '
                      f'got {self.personalize_steps!r}')
    if self.memory_budget_gb is not None and (
        isinstance(self.memory_budget_gb, bool)
        or not isinstance(self.memory_budget_gb, (int, float)) or self.memory_budget_gb <= 0):
      raise UserError(f'train.memory_budget_gb must be a positive number of GB or None, '
                      f'got {self.memory_budget_gb!r}')
    if not isinstance(self.seed, int) or self.seed < 0:
      raise UserError(f'train.seed must be a non-negative integer, got {self.seed!r}')
    if self.ema_decay is not None and (isinstance(self.ema_decay, bool) or not isinstance(
        self.ema_decay, (int, float)) or not 0.0 <= self.ema_decay < 1.0):
      raise UserError(f'train.ema_decay must be None or a number in [0, 1), '
                      f'got {self.ema_decay!r}')
    if self.init_from is not None and not (isinstance(self.init_from, str) and
                                           self.init_from.startswith(('hf:', 'job:'))):
      raise UserError(f"train.init_from must be 'hf:DIR', 'job:DIR' or 'job:DIR@STEP', "
                      f'got {self.init_from!r}')


@dataclasses.dataclass(frozen=True)
class Task:
  """Everything a run needs, built from the experiment's config."""

  model: nn.Module
  optimizer: optax.GradientTransformation
  algorithm: AlgorithmBuilder  # (loss_fn, optimizer) -> Algorithm
  data: DataSource
  mesh: MeshConfig = MeshConfig()
  train: TrainConfig = TrainConfig()
  experiment: str | None = None  # The registered key the CLI built this config from.
  # A preference loss (paxlike.trainer.preference_loss.PreferenceLoss) for pair data, or GRPO's
  # (paxlike.trainer.grpo_loss.GrpoLoss) for prompt data; None: the model's own loss
  # (paxlike.trainer.objectives: the config's type picks the objective).
  loss: Any = None

  def __post_init__(self):
    family = family_of(self.model)
    object.__setattr__(self, 'model', family.complete(self.model, self.data))  # Frozen: once.
    family.check_data(self.model, self.data)
    if self.built_algorithm is not None:
      check_fixed_cohort(self.built_algorithm, self.data)

  @functools.cached_property
  def built_algorithm(self) -> Algorithm | None:
    """`algorithm` built for this model's loss and the optimizer: what it declares it needs
    (its fixed cohort, its aggregator) is read from here. None for a task without one (tests
    that only evaluate)."""
    if self.algorithm is None:
      return None
    return self.algorithm(task_loss_fn(self.model, self.loss, self.data), self.optimizer)


def check_fixed_cohort(algorithm: Algorithm, data: DataSource) -> None:
  """Raises a one-line UserError unless `data`'s cohort is the one a fixed-cohort `algorithm`
  (see `Algorithm.fixed_cohort`) keeps state for."""
  fixed = algorithm.fixed_cohort
  if fixed is None:
    return
  if fixed.size != data.clients_per_round:
    raise UserError(f'algorithm.{fixed.arg}={fixed.size} but data.clients_per_round='
                    f'{data.clients_per_round}: set both to the same cohort size')
  if fixed.per_client and data.sampling != 'fixed':
    raise UserError(f'algorithm.{fixed.arg} keeps state per client, so it trains every client '
                    f"every round: set data.sampling='fixed', not {data.sampling!r}")
  if data.sampling == 'poisson':
    raise UserError(f'algorithm.{fixed.arg} keeps state per cohort slot, and a Poisson cohort '
                    "(data.sampling='poisson') has no fixed slots: set 'uniform' or 'fixed'")
