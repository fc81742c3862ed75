"""The federated export tests' task: DigitsFedAvg-sized configs trained through the trainer,
each algorithm's trainer run and export made once per pytest run, and the check that an
exported round's executor gives the trainer's rows and state (shared by tests/export and
tests/deploy)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import fiddle as fdl
import jax
import numpy as np

from paxlike.configs import federated as fed
from paxlike import registry
from paxlike.config import config_io
from paxlike.export import run, trees
from paxlike.export.__main__ import export_experiment
from paxlike.trainer import build, loop
from paxlike.trainer.checkpoint import Checkpoints
from tests.federated.lora_task import lora_config
from tests.helpers import made_once, metric_rows

TINY = ['data.batch_size=8', 'train.log_every=1', 'train.eval_every=100',
        'train.checkpoint_every=1']
ROUNDS = 2  # Trained and exported rounds of the shared runs (`trained_and_exported`).


def digits(algorithm: fdl.Partial | None = None) -> fdl.Config:
  """DigitsFedAvg with 3 clients a round of 2 local steps on batches of 8, and `algorithm`
  instead of FedAvg."""
  registry.import_all()
  cfg = registry.get('federated.DigitsFedAvg')().config()
  if algorithm is not None:
    cfg.algorithm = algorithm
  config_io.apply_overrides(cfg, [*TINY, 'data.clients_per_round=3', 'data.local_steps=2'])
  return cfg


def registered(name: str, *overrides: str) -> fdl.Config:
  """The registered experiment `name`'s config with `overrides`."""
  registry.import_all()
  cfg = registry.get(name)().config()
  config_io.apply_overrides(cfg, overrides)
  return cfg


# Per algorithm: its config given a directory of its own (LoRA writes its corpus there), and the
# experiment name its export's plan records.
ALGORITHMS: dict[str, tuple[Callable[[Path], fdl.Config], str]] = {
    'fed_adam': (lambda _: digits(fed.fed_adam(server_learning_rate=0.05)), 'digits_fedadam'),
    'diloco': (lambda _: digits(fed.diloco(num_replicas=3)), 'digits_diloco'),
    'dp_fedavg': (lambda _: registered('federated.DigitsDpFedAvg', *TINY,
                                       'data.clients_per_round=3'), 'federated.DigitsDpFedAvg'),
    'scaffold': (lambda _: registered('federated.DigitsScaffold', *TINY, 'data.num_clients=3',
                                      'data.clients_per_round=3', 'algorithm.num_clients=3',
                                      'data.local_steps=2'), 'federated.DigitsScaffold'),
    'lora_text': (lora_config, 'federated.TextLoraFedAvg'),
}


@dataclasses.dataclass(frozen=True)
class Trained:
  """An algorithm's config (train.num_steps=ROUNDS: the trainer evaluates at the last round),
  its trainer job of ROUNDS rounds (rows and final state as `train_to` gives them) and the
  export of its first ROUNDS rounds. Shared: read it, never write into it."""
  cfg: fdl.Config
  rows: list[dict]
  state: dict[str, np.ndarray]
  job: Path
  export: Path


def trained_and_exported(tmp_path_factory, algorithm: str) -> Trained:
  """ALGORITHMS[algorithm] trained and exported, made once per pytest run (tests.helpers.
  made_once): the flower and the export tests both compare against it."""
  make_cfg, experiment = ALGORITHMS[algorithm]

  def make(path: Path) -> None:
    path.mkdir(parents=True)
    cfg = make_cfg(path)
    config_io.apply_overrides(cfg, [f'train.num_steps={ROUNDS}'])
    _, state = train_to(cfg, path / 'job', ROUNDS)
    export_experiment(cfg, path / 'export', rounds=ROUNDS, experiment=experiment)
    np.savez(path / 'state.npz', **state)
    (path / 'config.json').write_text(config_io.to_json(cfg))

  path = made_once(tmp_path_factory, f'trained_and_exported_{algorithm}', make)
  cfg = config_io.load_file(path / 'config.json')
  with np.load(path / 'state.npz') as saved:
    state = dict(saved)
  return Trained(cfg, metric_rows(path / 'job'), state, path / 'job', path / 'export')


def train_to(cfg: fdl.Config, job: Path, steps: int) -> tuple[list[dict], dict]:
  """Trains `cfg` to `steps` in `job`; its metrics rows and the last checkpoint's state, named
  like the export's outputs."""
  cfg = cfg.__copy__()
  config_io.apply_overrides(cfg, [f'train.num_steps={steps}'])
  setup = build.setup(config_io.build(cfg))
  loop.train(setup, job)
  checkpoints = Checkpoints(job / 'checkpoints', 3)
  try:
    _, state, _ = checkpoints.restore(setup.program.abstract_state)
  finally:
    checkpoints.close()
  alg = jax.device_get(state.alg)
  return metric_rows(job), dict(zip(trees.leaf_names('state', alg), jax.tree.leaves(alg)))


def assert_round_matches(outputs: dict, row: dict, state: dict | None = None) -> None:
  """Executor outputs of one round vs the trainer's row (and checkpointed state) for it."""
  metrics = {k.removeprefix('metrics.'): v for k, v in outputs.items() if k.startswith('metrics.')}
  shared = set(metrics) & set(row)
  assert {'loss', 'accuracy', 'pseudo_grad_norm', 'clients'} <= shared
  for key in shared:
    np.testing.assert_allclose(metrics[key], row[key], rtol=1e-5, atol=1e-6, err_msg=key)
  for name, value in (state or {}).items():
    np.testing.assert_allclose(outputs[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def exported_rounds_match_training(trained: Trained) -> tuple[run.Export, list[dict]]:
  """Runs the executor on `trained`'s export for its ROUNDS rounds and asserts each matches the
  trainer's row (the last also its checkpointed state); (exported program, executor outputs
  per round)."""
  exported = run.load(trained.export)
  history = run.run_rounds(exported, ROUNDS)
  assert len(history) == len(trained.rows) == ROUNDS
  for outputs, row in zip(history[:-1], trained.rows):
    assert_round_matches(outputs, row)
  assert_round_matches(history[-1], trained.rows[-1], trained.state)
  return exported, history
