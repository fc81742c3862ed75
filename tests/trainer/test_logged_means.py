"""The logged training loss and accuracy are means over the steps since the previous row."""

import shutil

import jax
import numpy as np
import pytest

from paxlike.configs import fiddlers
from paxlike import registry
from paxlike.config import config_io
from paxlike.trainer import build, loop
from tests.helpers import metric_rows

pytestmark = pytest.mark.slow


@pytest.fixture(scope='module')
def setup():
  """StdlibTiny, 1 layer, 6 steps: rows at 3 and 6, checkpoints at 2, 4, 6."""
  registry.import_all()
  cfg = registry.get('lm.StdlibTiny')().config()
  fiddlers.tiny(cfg)
  config_io.apply_overrides(cfg, ['train.num_steps=6', 'train.log_every=3', 'train.eval_every=6',
                                  'train.checkpoint_every=2', 'data.num_eval_batches=1'])
  return build.setup(config_io.build(cfg))


@pytest.fixture(scope='module')
def per_step(setup):
  """Each step's own float32 loss and accuracy, from the compiled step alone (no train loop)."""
  state = setup.program.init(jax.random.key(setup.task.train.seed))
  out = []
  with jax.set_mesh(setup.program.mesh):
    for step in range(1, 7):
      state, metrics = setup.step(state, *loop.round_inputs(setup, step))
      out.append({k: np.float32(metrics[k]) for k in ('loss', 'accuracy')})
  return out


@pytest.fixture(scope='module')
def uninterrupted(setup, tmp_path_factory):
  job = tmp_path_factory.mktemp('means')
  loop.train(setup, job)
  return job


def float32_mean(values: list[np.float32]) -> float:
  total = values[0]
  for v in values[1:]:
    total = np.float32(total + v)  # In step order, as the device adds them.
  return float(np.float32(total / np.float32(len(values))))


def test_logged_loss_and_accuracy_are_the_means_since_the_previous_row(per_step, uninterrupted):
  rows = metric_rows(uninterrupted)
  assert [r['step'] for r in rows] == [3, 6]
  for row, steps in zip(rows, (per_step[:3], per_step[3:])):
    for key in ('loss', 'accuracy'):
      assert row[key] == float32_mean([s[key] for s in steps]), key
  assert rows[0]['loss'] != float(per_step[2]['loss'])  # Not the row step's own value.


def test_a_resume_between_rows_logs_the_uninterrupted_means(setup, uninterrupted, tmp_path):
  """As if killed after step 5: the last checkpoint is step 4, one step into the second row."""
  shutil.copytree(uninterrupted, tmp_path, dirs_exist_ok=True)
  shutil.rmtree(tmp_path / 'checkpoints' / '6')
  loop.train(setup, tmp_path)
  assert metric_rows(tmp_path) == metric_rows(uninterrupted)
