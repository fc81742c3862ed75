"""The persistent compilation cache is on by default: a rerun loads every compiled program from
~/.cache/paxlike/jax (XDG_CACHE_HOME honoured) and trains identically; an empty flag turns it off."""

import pytest

from tests.helpers import TINY, cli_env, metric_rows, run_cli


def cache_entries(directory):
  return sorted(p.name for p in directory.glob('*-cache')) if directory.is_dir() else []


@pytest.mark.slow
def test_a_rerun_compiles_nothing_new_and_trains_the_same(tmp_path):
  env = cli_env(XDG_CACHE_HOME=str(tmp_path / 'xdg'), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0')
  del env['JAX_COMPILATION_CACHE_DIR']  # The suite's shared cache; this test wants the default.
  cache = tmp_path / 'xdg' / 'paxlike' / 'jax'
  run_cli(*TINY, f'--job_log_dir={tmp_path / "first"}', env=env)
  first = cache_entries(cache)
  assert any(name.startswith('jit_train_step-') for name in first), first

  run_cli(*TINY, f'--job_log_dir={tmp_path / "second"}', env=env)
  assert cache_entries(cache) == first  # Every program was a hit.
  assert metric_rows(tmp_path / 'second') == metric_rows(tmp_path / 'first')

  off = {**env, 'XDG_CACHE_HOME': str(tmp_path / 'xdg_off')}
  run_cli(*TINY, '--fdl_set=train.num_steps=2', '--compilation_cache_dir=',
          f'--job_log_dir={tmp_path / "off"}', env=off)
  assert not (tmp_path / 'xdg_off' / 'paxlike' / 'jax').exists()
  assert (tmp_path / 'xdg_off' / 'paxlike' / 'tfds').is_dir()  # The same root, in use.
