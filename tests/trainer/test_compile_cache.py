"""The persistent compilation cache is on by default: a rerun loads every compiled program from
~/.cache/paxlike/jax (XDG_CACHE_HOME honoured), its init, train and eval steps from the store
kept there, and trains identically; a run, or a fine-tune, of another length or learning rate
compiles no new init or train step; an empty flag turns it off."""

import jax
import pytest

from paxlike.trainer import compile_cache
from tests.helpers import TINY, cli_env, metric_rows, run_cli


def cache_entries(directory):
  return sorted(p.name for p in directory.glob('*-cache')) if directory.is_dir() else []


@pytest.mark.slow
def test_a_rerun_compiles_nothing_new_and_trains_the_same(tmp_path):
  env = cli_env(XDG_CACHE_HOME=str(tmp_path / 'xdg'), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0')
  env.pop('JAX_COMPILATION_CACHE_DIR', None)  # The suite's shared cache; this test wants the default.
  cache = tmp_path / 'xdg' / 'paxlike' / 'jax'
  run_cli(*TINY, f'--job_log_dir={tmp_path / "first"}', env=env)
  first = cache_entries(cache)
  assert any(name.startswith('jit_train_step-') for name in first), first
  # Its init, train step and eval step, kept compiled for the rerun (core.program_store).
  kept = {p: p.stat().st_mtime_ns for p in (cache / 'paxlike-train').glob('*.executable')}
  assert len(kept) == 3

  run_cli(*TINY, f'--job_log_dir={tmp_path / "second"}', env=env)
  assert cache_entries(cache) == first  # Every program was a hit.
  assert all(p.stat().st_mtime_ns > seen for p, seen in kept.items())  # Read, so marked used.
  assert metric_rows(tmp_path / 'second') == metric_rows(tmp_path / 'first')

  # An eval of the job loads the run's init and eval step, and compiles no train step.
  read = {p: p.stat().st_mtime_ns for p in kept}
  run_cli(*TINY, '--mode=eval', f'--job_log_dir={tmp_path / "second"}', env=env)
  assert cache_entries(cache) == first
  assert sorted(p.stat().st_mtime_ns > seen for p, seen in read.items()) == [False, True, True]

  # Another run length and peak learning rate: the schedule's numbers are optimizer state, so
  # the init and the train step are the same programs (only the small one that computes the
  # numbers is compiled anew).
  run_cli(*TINY, '--fdl_set=train.num_steps=12',
          '--fdl_set=optimizer.learning_rate.peak_value=0.01',
          f'--job_log_dir={tmp_path / "other"}', env=env)
  new = set(cache_entries(cache)) - set(first)
  assert sorted(name.split('-')[0] for name in new) == ['jit__fresh_hyperparams'], new

  # Fine-tunes from the first job's params: their init (the import path's) takes the numbers
  # as inputs too, so one at the other length and learning rate compiles nothing new (both
  # sets of numbers were computed above).
  tune = [*TINY, f'--fdl_set=train.init_from=job:{tmp_path / "first"}']
  before = set(cache_entries(cache))
  run_cli(*tune, f'--job_log_dir={tmp_path / "tune"}', env=env)
  tuned = cache_entries(cache)
  assert 'jit__init_with' in {name.split('-')[0] for name in set(tuned) - before}, tuned
  run_cli(*tune, '--fdl_set=train.num_steps=12',
          '--fdl_set=optimizer.learning_rate.peak_value=0.01',
          f'--job_log_dir={tmp_path / "tune_other"}', env=env)
  assert cache_entries(cache) == tuned


def test_an_empty_flag_turns_it_off_and_jax_s_own_variable_wins(monkeypatch, tmp_path):
  monkeypatch.delenv('JAX_COMPILATION_CACHE_DIR')
  monkeypatch.delenv('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', raising=False)
  before = (jax.config.jax_compilation_cache_dir, jax.config.jax_compilation_cache_max_size,
            jax.config.jax_persistent_cache_min_compile_time_secs)
  assert compile_cache.configure('') is None
  assert jax.config.jax_compilation_cache_dir == before[0]  # Untouched.
  try:
    # paxlike's own directory is bounded and keeps compiles of a tenth of a second (a small
    # model's decode loop), not only JAX's default of those over a second.
    assert compile_cache.configure(str(tmp_path / 'own')) == str(tmp_path / 'own')
    assert jax.config.jax_compilation_cache_max_size == compile_cache.MAX_BYTES
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.1
    # JAX's variable for the threshold wins.
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 2.0)
    monkeypatch.setenv('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '2.0')
    compile_cache.configure(str(tmp_path / 'own'))
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 2.0
    # JAX's variable names the directory and leaves the bound to JAX's own settings.
    jax.config.update('jax_compilation_cache_max_size', -1)
    monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', str(tmp_path))
    assert compile_cache.configure(str(tmp_path / 'ignored')) == str(tmp_path)
    assert jax.config.jax_compilation_cache_dir == str(tmp_path)
    assert jax.config.jax_compilation_cache_max_size == -1
  finally:  # This worker's other tests keep the suite's cache.
    jax.config.update('jax_compilation_cache_dir', before[0])
    jax.config.update('jax_compilation_cache_max_size', before[1])
    jax.config.update('jax_persistent_cache_min_compile_time_secs', before[2])


def test_the_default_dir_follows_xdg_cache_home(monkeypatch, tmp_path):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  assert compile_cache.default_dir() == str(tmp_path / 'paxlike' / 'jax')
