"""federated.TextLoraFedAvg at test size, on a corpus written to a temporary directory: a 1-layer
d32 byte LM, 3 clients a round of 2 local steps on 2 rows of 16 tokens."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import fiddle as fdl
import numpy as np

from paxlike import registry
from paxlike.config import config_io
from paxlike.trainer import build
from paxlike.trainer.checkpoint import Checkpoints

SMALL = ['model.num_layers=1', 'model.d_model=32', 'model.num_heads=2', 'model.d_ff=64',
         'model.max_len=16', 'data.seq_len=16', 'data.batch_size=2', 'data.local_steps=2',
         'data.clients_per_round=3', 'data.num_eval_batches=1', 'data.eval_batch_size=4',
         'data.eval_fraction=0.1', 'train.log_every=1', 'train.eval_every=100',
         'train.checkpoint_every=1', 'train.max_to_keep=5', 'model.lora_rank=2']


def write_corpus(directory: Path) -> Path:
  """Paragraphs of random words (a fixed seed), one text file."""
  rng = np.random.default_rng(0)
  words = ['the', 'king', 'lord', 'sweet', 'night', 'love', 'speak', 'hath', 'thou', 'now']
  text = '\n\n'.join(' '.join(rng.choice(words, 12)) for _ in range(300))
  path = directory / 'corpus.txt'
  path.write_text(text + '\n')
  return path


def lora_config(corpus_dir: Path, algorithm: Any = None) -> fdl.Config:
  """TextLoraFedAvg's config at test size (SMALL), on a corpus in `corpus_dir`, with
  `algorithm` (a paxlike.configs.federated preset) instead of FedAvg."""
  registry.import_all()
  cfg = registry.get('federated.TextLoraFedAvg')().config()
  config_io.apply_overrides(cfg, [*SMALL, f'data.files={write_corpus(corpus_dir)}'])
  if algorithm is not None:
    cfg.algorithm = algorithm
  return cfg


@dataclasses.dataclass(frozen=True)
class Placed:
  trainer: build.Trainer

  def with_steps(self, steps: int) -> build.Trainer:
    """The trainer running to `steps` (the same compiled programs)."""
    task = self.trainer.task
    return dataclasses.replace(self.trainer, task=dataclasses.replace(
        task, train=dataclasses.replace(task.train, num_steps=steps)))


def lora_setup(corpus_dir: Path, algorithm: Any = None) -> Placed:
  return Placed(build.setup(config_io.build(lora_config(corpus_dir, algorithm))))


def restored_state(trainer: build.Trainer, job: Path, step: int) -> Any:
  """The train state committed at `step` in `job`."""
  checkpoints = Checkpoints(job / 'checkpoints', 5, read_only=True)
  try:
    return checkpoints.restore(trainer.program.abstract_state, step=step)[1]
  finally:
    checkpoints.close()
