"""A run resumed with a changed optimizer hyperparameter (allowed by --allow_config_change)
trains with the new value: optax.inject_hyperparams keeps constants in the optimizer state, so
without care the checkpoint's old value would silently win."""

import pytest

from paxlike import registry
from paxlike.config import config_io
from paxlike.trainer import build, loop
from tests.helpers import metric_rows


def digits_fedavg(*overrides: str) -> build.Trainer:
  registry.import_all()
  cfg = registry.get('federated.DigitsFedAvg')().config()
  config_io.apply_overrides(cfg, ['train.log_every=1', 'train.eval_every=4',
                                  'train.checkpoint_every=2', *overrides])
  return build.setup(config_io.build(cfg))


@pytest.mark.slow
def test_a_resume_with_a_new_server_learning_rate_uses_it(tmp_path):
  loop.train(digits_fedavg('train.num_steps=2'), tmp_path)
  changed = digits_fedavg('train.num_steps=4', 'algorithm.server_optimizer.learning_rate=0.5')
  loop.train(changed, tmp_path, allow_config_change=True)
  rates = {row['step']: row['server_learning_rate'] for row in metric_rows(tmp_path)}
  assert rates == {1: 1.0, 2: 1.0, 3: 0.5, 4: 0.5}
