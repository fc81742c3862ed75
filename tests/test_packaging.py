"""The wheel: built from the source tree, installed outside it, run from another directory."""

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from paxlike.data import root
from tests import helpers

WHERE = ('import json, paxlike, paxlike.configs, paxlike.experiments; '
         'from paxlike.data import root; '
         'print(json.dumps({"modules": [m.__file__ for m in (paxlike, paxlike.configs, '
         'paxlike.experiments)], "data_root": str(root.data_root())}))')


def pip(*args: str, cwd) -> None:
  proc = subprocess.run([sys.executable, '-m', 'pip', *args, '--no-deps', '--no-index', '-q'],
                        cwd=cwd, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
def test_the_installed_wheel_runs_the_default_experiment_from_anywhere(tmp_path):
  src, site, elsewhere = tmp_path / 'src', tmp_path / 'site', tmp_path / 'elsewhere'
  shutil.copytree(helpers.REPO, src, ignore=shutil.ignore_patterns(
      '.git', '.venv', '__pycache__', 'build', '*.egg-info', '.pytest_cache'))
  pip('wheel', '--no-build-isolation', '-w', str(tmp_path / 'dist'), str(src), cwd=tmp_path)
  pip('install', '--target', str(site), *glob.glob(str(tmp_path / 'dist' / '*.whl')), cwd=tmp_path)
  installed = {p.name for p in site.iterdir()}
  # One top-level package: the experiments and building blocks are paxlike.experiments and
  # paxlike.configs, so a user's own `configs` or `experiments` package clashes with nothing.
  assert installed == {'bin', 'paxlike', 'paxlike-0.1.0.dist-info'}
  assert {'configs', 'experiments'} <= {p.name for p in (site / 'paxlike').iterdir()}

  elsewhere.mkdir()
  env = {k: v for k, v in helpers.cli_env().items() if k != root.DATA_DIR_ENV}
  # Dependencies come from the running venv; prepared data from this session's tfds cache.
  env.update(PYTHONPATH=str(site), XDG_CACHE_HOME=str(tmp_path / 'cache'),
             **{root.TFDS_DIR_ENV: str(root.prepared_dir())})
  where = json.loads(subprocess.run([sys.executable, '-c', WHERE], cwd=elsewhere, env=env,
                                    capture_output=True, text=True, check=True).stdout)
  assert all(m.startswith(str(site) + os.sep) for m in where['modules']), where
  assert where['data_root'] == str(tmp_path / 'cache' / 'paxlike' / 'data')

  job = tmp_path / 'job'
  proc = subprocess.run([sys.executable, str(site / 'bin' / 'paxlike'), '--exp=lm.StdlibTiny',
                         f'--job_log_dir={job}', '--fdl_fiddler=tiny',
                         '--fdl_set=train.num_steps=2'],
                        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=240)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert [r['step'] for r in helpers.metric_rows(job)] == [2]
