"""train.ema_decay: the train state's EMA equals a numpy EMA of the params the trainer produced
at each step, resumes bitwise, and is evaluated beside the params as eval_ema_*."""

import jax
import numpy as np
import pytest

from paxlike.trainer import build, loop, train_state
from paxlike.errors import UserError
from paxlike.trainer.task import TrainConfig
from tests.helpers import metric_rows
from tests.tiny_task import restored, tiny_task, with_steps

DECAY = 0.8


def leaves(tree) -> list[np.ndarray]:
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


@pytest.fixture(scope='module')
def placed():
  return build.setup(tiny_task(f'train.ema_decay={DECAY}', 'train.checkpoint_every=1',
                               'train.max_to_keep=5', 'train.log_every=1', 'train.eval_every=3'))



def test_ema_by_hand_for_three_steps(placed, tmp_path):
  loop.train(with_steps(placed, 3), tmp_path)
  states = [restored(placed, tmp_path, step) for step in (1, 2, 3)]
  with jax.set_mesh(placed.program.mesh):
    ema = leaves(placed.program.init(jax.random.key(placed.task.train.seed)).alg.params)
  for state in states:
    params = leaves(state.alg.params)
    ema = [np.float32(DECAY) * e + np.float32(1 - DECAY) * p for e, p in zip(ema, params)]
    for mine, theirs in zip(ema, leaves(state.ema)):
      np.testing.assert_allclose(theirs, mine, rtol=2e-6, atol=1e-7)
  # Not trivially the params: after 3 steps the EMA lags behind them.
  assert max(np.abs(e - p).max() for e, p in zip(ema, leaves(states[-1].alg.params))) > 1e-4
  row = metric_rows(tmp_path)[-1]
  assert row['step'] == 3 and {'eval_loss', 'eval_ema_loss', 'eval_ema_accuracy'} <= set(row)
  assert 'eval_ema_loss' not in metric_rows(tmp_path)[0]  # Only at eval steps.
  # eval_ema_* are the metrics of the hand-made EMA params.
  tree = jax.tree.unflatten(jax.tree.structure(states[-1].alg.params), ema)
  with jax.set_mesh(placed.program.mesh):
    direct, _ = placed.evaluator.evaluate(states[-1].alg._replace(params=tree))
  assert row['eval_ema_loss'] == pytest.approx(direct['loss'], rel=1e-6)
  assert row['eval_ema_loss'] != pytest.approx(row['eval_loss'], rel=1e-4)


def test_ema_resumes_bitwise(placed, tmp_path):
  whole, parts = tmp_path / 'whole', tmp_path / 'parts'
  loop.train(with_steps(placed, 3), whole)
  loop.train(with_steps(placed, 2), parts)
  loop.train(with_steps(placed, 3), parts)  # Resumes at step 2.
  a, b = restored(placed, whole, 3), restored(placed, parts, 3)
  for x, y in zip(leaves(a), leaves(b)):
    assert x.tobytes() == y.tobytes()
  assert metric_rows(whole)[-1] == metric_rows(parts)[-1]  # Step 3, eval_ema_* included.


def test_no_ema_keeps_the_old_state_layout():
  no_ema = build.setup(tiny_task())
  assert not hasattr(no_ema.program.abstract_state, 'ema')
  assert train_state.ema_params(no_ema.program.abstract_state) is None


@pytest.mark.parametrize('bad', [1.0, -0.1, True, 'x'])
def test_bad_decay_is_a_user_error(bad):
  with pytest.raises(UserError, match='ema_decay'):
    TrainConfig(ema_decay=bad)


@pytest.mark.slow
def test_eval_mode_reports_the_ema_beside_the_params(tmp_path):
  import json
  from tests.helpers import TINY, run_cli
  args = [*TINY, f'--job_log_dir={tmp_path}', '--fdl_set=train.ema_decay=0.9']
  run_cli(*args)
  last = metric_rows(tmp_path)[-1]
  out = json.loads(run_cli(*args, '--mode=eval').stdout)
  assert out['step'] == 20
  assert (out['eval_loss'], out['eval_ema_loss']) == (last['eval_loss'], last['eval_ema_loss'])
  assert out['eval_ema_loss'] != out['eval_loss']
