"""The federated export tests' task: DigitsFedAvg-sized configs trained through the trainer,
and the check that an exported round's executor gives the trainer's rows and state (shared by
tests/export and tests/deploy)."""

from __future__ import annotations

from pathlib import Path

import fiddle as fdl
import jax
import numpy as np

from paxlike import registry
from paxlike.config import config_io
from paxlike.export import run, trees
from paxlike.export.__main__ import export_experiment
from paxlike.trainer import build, loop
from paxlike.trainer.checkpoint import Checkpoints
from tests.helpers import metric_rows

TINY = ['data.batch_size=8', 'train.log_every=1', 'train.eval_every=100',
        'train.checkpoint_every=1']
def digits(algorithm: fdl.Partial | None = None) -> fdl.Config:
  """DigitsFedAvg with 3 clients a round of 2 local steps on batches of 8, and `algorithm`
  instead of FedAvg."""
  registry.import_all()
  cfg = registry.get('federated.DigitsFedAvg')().config()
  if algorithm is not None:
    cfg.algorithm = algorithm
  config_io.apply_overrides(cfg, [*TINY, 'data.clients_per_round=3', 'data.local_steps=2'])
  return cfg


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


def exported_rounds_match_training(cfg: fdl.Config, tmp_path: Path, experiment: str
                                   ) -> tuple[run.Export, list[dict], dict]:
  """Trains `cfg` 2 rounds, exports its round, runs the executor 2 rounds and asserts both
  match the trainer's rows (the second also its checkpointed state); (exported program,
  executor outputs per round, the trainer's state)."""
  rows, state = train_to(cfg, tmp_path / 'job', 2)
  export_experiment(cfg, tmp_path / 'export', rounds=2, experiment=experiment)
  exported = run.load(tmp_path / 'export')
  history = run.run_rounds(exported, 2)
  assert_round_matches(history[0], rows[0])
  assert_round_matches(history[1], rows[1], state)
  return exported, history, state
