"""A step whose loss, gradient or new state is non-finite is never saved or kept, for every
algorithm: the trainer checks the whole new state, not only the loss the algorithm reports."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike import registry
from paxlike.config import config_io
from paxlike.trainer import build, loop, train_state
from paxlike.trainer.checkpoint import Checkpoints
from tests.helpers import metric_rows, run_cli

pytestmark = pytest.mark.slow

# FedAvg with one local step: the clients' loss is finite, but the update sends params to ±inf.
DIGITS = ['--exp=federated.DigitsFedAvg', '--fdl_set=data.local_steps=1',
          '--fdl_set=train.checkpoint_every=1', '--fdl_set=train.log_every=1',
          '--fdl_set=train.eval_every=100', '--fdl_set=train.max_to_keep=10']
EXPLODE = ['--fdl_set=optimizer.learning_rate=1e30',
           '--fdl_set=algorithm.server_optimizer.learning_rate=1e30']


def test_all_finite_looks_at_every_float_leaf_and_ignores_the_rest():
  tree = {'w': jnp.ones((3,)), 'count': jnp.array(7), 'key': jax.random.key(0),
          'opt': (jnp.zeros((2, 2), jnp.bfloat16),)}
  assert bool(train_state.all_finite(tree))
  for bad in (jnp.inf, -jnp.inf, jnp.nan):
    bad_opt = (jnp.zeros((2, 2), jnp.bfloat16).at[1, 0].set(bad),)
    assert not bool(train_state.all_finite({**tree, 'opt': bad_opt}))


def test_grouped_check_finds_a_bad_value_in_every_leaf_of_a_real_train_state():
  """The step checks its state in groups of same-shaped, same-sharded leaves (params and their
  Adam moments together): one inf or nan anywhere, in any leaf, still makes it False."""
  registry.import_all()
  s = build.setup(config_io.build(registry.get('lm.StdlibTiny')().config()))
  groups = train_state.finite_groups(s.program.abstract_state.alg)
  leaves, treedef = jax.tree.flatten(s.program.init(jax.random.key(0)).alg)
  floats = [i for i, x in enumerate(leaves) if jnp.issubdtype(x.dtype, jnp.inexact)]
  assert sorted(i for g in groups for i in g) == list(range(len(floats)))  # Each leaf once.
  assert len(groups) < len(floats) / 3  # Params and both moments share their groups.
  check = jax.jit(lambda tree: train_state.all_finite(tree, groups))
  assert bool(check(jax.tree.unflatten(treedef, leaves)))
  for n, i in enumerate(floats):
    bad = (jnp.inf, -jnp.inf, jnp.nan)[n % 3]
    broken = list(leaves)
    broken[i] = leaves[i].at[(0,) * leaves[i].ndim].set(bad)
    assert not bool(check(jax.tree.unflatten(treedef, broken))), f'leaf {i} ({bad}) passed'


def test_groups_stack_at_most_group_bytes_of_leaves(monkeypatch):
  monkeypatch.setattr(train_state, 'GROUP_BYTES', 3 * 400)  # Three 100-float leaves a group.
  tree = {'a': [jax.ShapeDtypeStruct((100,), jnp.float32) for _ in range(7)],
          'big': jax.ShapeDtypeStruct((1000,), jnp.float32),
          'n': jax.ShapeDtypeStruct((), jnp.int32), 'b': jax.ShapeDtypeStruct((100,), jnp.bfloat16)}
  # Flatten order: a0..a6 (0-6), b (7), big (8); the int leaf is not checked.
  assert train_state.finite_groups(tree) == ((0, 1, 2), (3, 4, 5), (6,), (7,), (8,))


def restored_states(job) -> dict[int, train_state.TrainState]:
  """Every committed step of `job`, restored with the run's own config."""
  s = build.setup(config_io.build(config_io.load_file(job / 'config.json')))
  checkpoints = Checkpoints(job / 'checkpoints', 10)
  try:
    steps = sorted(int(p.name) for p in (job / 'checkpoints').iterdir() if p.name.isdigit())
    return {step: checkpoints.restore(s.program.abstract_state, step)[1] for step in steps}
  finally:
    checkpoints.close()


def finite_leaves(state: train_state.TrainState) -> bool:
  return all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state.alg)
             if jnp.issubdtype(jnp.result_type(x), jnp.inexact))


def test_exploding_federated_round_exits_1_and_no_checkpoint_holds_a_nonfinite_value(tmp_path):
  proc = run_cli(*DIGITS, '--fdl_set=train.num_steps=3', *EXPLODE, f'--job_log_dir={tmp_path / "a"}',
                 check=False)  # The issue's repro: round 1's loss is finite, its params are not.
  assert proc.returncode == 1, proc.stderr[-2000:]
  last = re.fullmatch(r'paxlike: failed: non-finite parameters or optimizer state at step 1: '
                      r'loss=(\S+); the last checkpoint is untouched',
                      proc.stderr.strip().splitlines()[-1])
  assert last and float(last.group(1)) == pytest.approx(2.2463455, rel=1e-6), proc.stderr[-2000:]
  assert not any(p.name.isdigit() for p in (tmp_path / 'a' / 'checkpoints').iterdir())
  # Three good rounds, then a resume whose client step overflows float32 in round 4.
  job = tmp_path / 'b'
  run_cli(*DIGITS, '--fdl_set=train.num_steps=3', f'--job_log_dir={job}')
  proc = run_cli(*DIGITS, '--fdl_set=train.num_steps=6', '--fdl_set=optimizer.learning_rate=1e38',
                 '--allow_config_change', f'--job_log_dir={job}', check=False)
  assert proc.returncode == 1, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1].startswith(
      'paxlike: failed: non-finite parameters or optimizer state at step 4: loss=')
  states = restored_states(job)
  assert sorted(states) == [1, 2, 3]
  assert all(finite_leaves(state) for state in states.values())


def test_skip_nonfinite_keeps_the_last_finite_federated_state(tmp_path):
  run_cli(*DIGITS, '--fdl_set=train.num_steps=3', *EXPLODE, '--fdl_set=train.skip_nonfinite=True',
          f'--job_log_dir={tmp_path}')
  assert [r['nonfinite_steps'] for r in metric_rows(tmp_path)] == [1, 2, 3]
  assert all(np.isfinite(r['eval_loss']) for r in metric_rows(tmp_path) if 'eval_loss' in r)
  s = build.setup(config_io.build(config_io.load_file(tmp_path / 'config.json')))
  initial = s.program.init(jax.random.key(s.task.train.seed))  # Every round blew up: nothing was applied.
  for step, state in restored_states(tmp_path).items():
    assert int(state.nonfinite_steps) == step
    for got, want in zip(jax.tree.leaves(state.alg.params), jax.tree.leaves(initial.alg.params)):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def _overflowing_fed_adam(tmp_path):
  """DigitsFedAvg's clients with a server FedAdam, and a client sgd(1e30): the pseudo-gradient
  is ~1e30, so the server's second moment (its square) overflows float32 while the params,
  moved by m / sqrt(v) = 0, stay finite. That state must never be kept or saved."""
  from paxlike.configs import federated as fed
  registry.import_all()
  cfg = registry.get('federated.DigitsFedAvg')().config()
  cfg.algorithm = fed.fed_adam()
  config_io.apply_overrides(cfg, ['optimizer.learning_rate=1e30', 'data.local_steps=1',
                                  'train.num_steps=2', 'train.checkpoint_every=1'])
  path = tmp_path / 'fedadam.json'
  path.write_text(config_io.to_json(cfg))
  return cfg, path


def test_a_finite_step_with_a_nonfinite_server_state_fails_the_real_steps_check(tmp_path):
  cfg, _ = _overflowing_fed_adam(tmp_path)
  placed = build.setup(config_io.build(cfg))
  state = placed.program.init(jax.random.key(0))
  with jax.set_mesh(placed.program.mesh):
    new, metrics = placed.step(state, *loop.round_inputs(placed, 1))
  assert np.isfinite(float(metrics['loss']))
  finite = lambda tree: all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(tree))
  assert finite(new.alg.params)  # Only the server optimizer's state went non-finite.
  assert not finite(new.alg)
  assert not bool(metrics[train_state.FINITE])


def test_the_cli_saves_nothing_of_a_nonfinite_server_state(tmp_path):
  _, path = _overflowing_fed_adam(tmp_path)
  job = tmp_path / 'job'
  proc = run_cli(f'--fdl_config={path}', f'--job_log_dir={job}', check=False)
  assert proc.returncode == 1, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1].startswith(
      'paxlike: failed: non-finite parameters or optimizer state at step 1')
  assert not any(p.name.isdigit() for p in (job / 'checkpoints').iterdir())
