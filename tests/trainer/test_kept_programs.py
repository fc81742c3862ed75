"""A task built as another was (the same config key and data) loads its init, train step and
eval step compiled (core.program_store, `build.setup(kept_as=...)`): it traces none of them and
computes what a fresh compile computes. A key that differs compiles anew, and a program that
JAX's own cache served is not kept (XLA:CPU cannot serialize an executable it loaded)."""

import jax
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache

from paxlike.config import config_io
from paxlike.core import program_store
from paxlike.trainer import build, losses, program
from tests.tiny_task import tiny_config, tiny_task


def cache_at(directory, enabled: bool) -> None:
  """JAX's compilation cache (and so the store) at `directory`, on or off. JAX reads its
  settings once per process: reset, it reads them again at the next compile."""
  jax.config.update('jax_compilation_cache_dir', directory)
  jax.config.update('jax_enable_compilation_cache', enabled)
  compilation_cache.reset_cache()


@pytest.fixture
def store_dir(tmp_path):
  """The store in `tmp_path`, beside JAX's cache, empty: the first compile of each program is
  XLA's, the next of it JAX's cache's. This worker's other tests get the suite's cache back."""
  before = jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache
  cache_at(str(tmp_path), True)
  try:
    yield tmp_path / program_store.TRAIN_DIRNAME
  finally:
    cache_at(*before)


@pytest.fixture
def traces(monkeypatch) -> dict[str, int]:
  """How often the model's init, the train step and the eval loss are traced."""
  counts = {'init_params': 0, 'train_step': 0, 'per_example_loss': 0}

  def counted(module, name):
    original = getattr(module, name)

    def call(*args, **kwargs):
      counts[name] += 1
      return original(*args, **kwargs)
    monkeypatch.setattr(module, name, call)
  counted(program, 'init_params')
  counted(program, 'train_step')
  counted(losses, 'per_example_loss')
  return counts


def first_step(trainer: build.Trainer):
  """The state and metrics of one train step from the fresh init, and the eval metrics of it."""
  state = trainer.program.init(jax.random.key(0))
  batches, weights = trainer.task.data.round_batches(0, 1)
  state, metrics = trainer.step(state, batches, weights, jax.random.key(1))
  evals, _ = trainer.evaluator.evaluate_state(state)
  return jax.device_get((state, metrics)), evals


def key_of(cfg):
  return build.KeptAs(config_io.trace_key(cfg), None)


def test_a_task_built_the_same_way_traces_nothing_and_computes_the_same(store_dir, traces):
  cfg = tiny_config()
  fresh = first_step(build.setup(tiny_task(), kept_as=key_of(cfg)))
  assert min(traces.values()) >= 1
  kept = set(store_dir.glob('*.executable'))
  assert len(kept) == 3 and len(list(store_dir.glob('*.pickle'))) == 1  # And the params' shapes.

  traces.update(dict.fromkeys(traces, 0))
  loaded = first_step(build.setup(tiny_task(), kept_as=key_of(cfg)))
  assert traces == dict.fromkeys(traces, 0)
  for a, b in zip(jax.tree.leaves(loaded[0]), jax.tree.leaves(fresh[0])):
    np.testing.assert_array_equal(a, b)
  assert loaded[1] == fresh[1]

  # Only the loop reads its intervals: a run that changes them keeps its programs.
  intervals = tiny_config('train.eval_every=3', 'train.log_every=2', 'train.max_to_keep=1')
  build.setup(config_io.build(intervals), kept_as=key_of(intervals))
  assert traces == dict.fromkeys(traces, 0)

  # The same programs under another key: JAX's cache serves them, and XLA:CPU cannot serialize
  # an executable it loaded, so none is kept for that key.
  again = build.setup(tiny_task(), kept_as=build.KeptAs('another key', None))
  assert traces['train_step'] == 1
  assert set(store_dir.glob('*.executable')) == kept
  assert first_step(again)[1] == fresh[1]


def test_what_the_programs_read_of_the_config_is_in_the_key():
  cfg = tiny_config()
  assert config_io.trace_key(tiny_config('optimizer.learning_rate.peak_value=0.005')) != \
      config_io.trace_key(cfg)
  # A schedule whose length is the run's (with_run_lengths) moves with train.num_steps.
  longer = tiny_config(f'train.num_steps={cfg.train.num_steps + 1}')
  differs = [line for line in config_io.to_text(cfg).splitlines()
             if line not in config_io.to_text(longer)]
  assert any(not line.startswith('train.') for line in differs), differs
  assert config_io.trace_key(longer) != config_io.trace_key(cfg)
  every = tiny_config('train.eval_every=3', 'train.log_every=2', 'train.checkpoint_every=9',
                      'train.max_to_keep=7')
  assert config_io.trace_key(every) == config_io.trace_key(cfg)


def test_an_unreadable_executable_is_compiled_again(store_dir, traces):
  cfg = tiny_config()
  fresh = first_step(build.setup(tiny_task(), kept_as=key_of(cfg)))
  kept = sorted(store_dir.glob('*.executable'))
  assert len(kept) == 3
  for path in kept:  # Cut short (a store copied in part, say): loading it fails.
    path.write_bytes(path.read_bytes()[:100])
  traces.update(dict.fromkeys(traces, 0))
  loaded = first_step(build.setup(tiny_task(), kept_as=key_of(cfg)))
  assert min(traces.values()) >= 1  # Traced again: nothing was loaded from the store.
  for a, b in zip(jax.tree.leaves(loaded[0]), jax.tree.leaves(fresh[0])):
    np.testing.assert_array_equal(a, b)
  assert loaded[1] == fresh[1]
