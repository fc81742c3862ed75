"""`python -m paxlike.export` on federated.DigitsFedAvg-sized runs: the executor's rounds give the
trainer's own metrics rows and checkpoints, a tampered plan is refused with one line, and the
executor loads no experiment code."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from paxlike.configs import federated as fed
from paxlike.export import run
from paxlike.export.__main__ import export_experiment
from tests.export.export_task import (TINY, assert_round_matches, digits,
                                      exported_rounds_match_training, train_to,
                                      trained_and_exported)
from tests.helpers import REPO, cli_env, made_once, run_python

pytestmark = pytest.mark.slow  # Trainer runs and CLI subprocesses, each a few seconds.

CLI_TINY = ['--exp=federated.DigitsFedAvg', '--fdl_set=data.clients_per_round=3',
            '--fdl_set=data.local_steps=2', *(f'--fdl_set={o}' for o in TINY)]


def test_diloco_export_runs_like_training(tmp_path_factory):
  trained = trained_and_exported(tmp_path_factory, 'diloco')
  exported_rounds_match_training(trained)
  assert any(n.startswith('state.client_opt_state') for n in trained.state)  # At the clients.


def test_dp_fedavg_export_runs_like_training(tmp_path_factory):
  """Clipping is client code, the noise and the adaptive clip norm are server code: the same
  rounds as the trainer's, noise included (it comes from the round's key)."""
  trained = trained_and_exported(tmp_path_factory, 'dp_fedavg')
  exported_rounds_match_training(trained)
  assert any(n.startswith('state.aggregator_state') for n in trained.state)


def test_scaffold_export_runs_like_training(tmp_path_factory):
  """SCAFFOLD's client optimizer starts inside the client scan (its step count has no clients
  axis): the export carries the control variates at the clients and runs the trainer's rounds."""
  trained = trained_and_exported(tmp_path_factory, 'scaffold')
  exported, history = exported_rounds_match_training(trained)
  assert 'control_norm' in trained.rows[1]
  assert 'metrics.control_norm' in history[1]
  assert {s['name'].split('.')[1] for s in exported.plan['inputs']
          if s['placement'] == 'clients' and s['carried']} == {'client_controls'}


def test_fedadam_export_from_a_job_dir_continues_its_training(tmp_path):
  cfg, job = digits(fed.fed_adam(server_learning_rate=0.05)), tmp_path / 'job'
  _, checkpointed = train_to(cfg, job, 1)
  export_experiment(cfg, tmp_path / 'export', job_log_dir=str(job), experiment='digits_fedadam')
  exported = run.load(tmp_path / 'export')
  assert exported.plan['start_step'] == 1 and exported.plan['algorithm'] == 'fed_adam'
  assert set(exported.carried) == set(checkpointed)
  for name, value in checkpointed.items():  # The job's latest checkpoint, as is.
    np.testing.assert_array_equal(exported.carried[name], value, err_msg=name)
  (outputs,) = run.run_rounds(exported, 1)
  rows, state = train_to(cfg, job, 2)  # The same job dir, resumed for one more round.
  assert_round_matches(outputs, rows[-1], state)


@pytest.fixture(scope='module')
def fedavg_export(tmp_path_factory) -> Path:
  """The CLI's export of two tiny DigitsFedAvg rounds, made once per pytest run (its tests only
  read it, or copy it)."""
  def make(out: Path) -> None:
    proc = run_python(['-m', 'paxlike.export', *CLI_TINY, f'--out={out}', '--rounds=2'],
                      cli_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {'plan.json', 'client.jaxexport', 'server_pre.jaxexport', 'server_post.jaxexport',
            'state', 'rounds.npz'} <= {line.split('\t')[0] for line in proc.stdout.splitlines()}
  return made_once(tmp_path_factory, 'fedavg_cli_export', make)


def executor(directory: Path, *args: str) -> subprocess.CompletedProcess:
  return run_python(['-m', 'paxlike.export.run', f'--dir={directory}', *args], cli_env(),
                    timeout=300)


def test_fedavg_cli_export_runs_like_training(fedavg_export, tmp_path):
  proc = executor(fedavg_export, '--rounds=2', f'--out={tmp_path / "last.npz"}')
  assert proc.returncode == 0, proc.stderr[-3000:]
  printed = [json.loads(line) for line in proc.stdout.splitlines()]
  assert [p['round'] for p in printed] == [1, 2]
  rows, state = train_to(digits(), tmp_path / 'job', 2)
  with np.load(tmp_path / 'last.npz') as last:
    assert_round_matches(dict(last), rows[1], state)
  assert printed[0]['metrics.loss'] == pytest.approx(rows[0]['loss'], rel=1e-5)
  # Both written whole, through a temporary beside them that is gone.
  for made in (fedavg_export, tmp_path / 'last.npz'):
    assert [p.name for p in made.parent.iterdir() if p.name.startswith('.')] == []


def test_plan_records_names_and_hash(fedavg_export):
  plan = json.loads((fedavg_export / 'plan.json').read_text())
  assert (plan['experiment'], plan['algorithm'], plan['clients']) == (
      'federated.DigitsFedAvg', 'fed_avg', 3)
  assert plan['jax_version'] == jax.__version__ and len(plan['config_sha256']) == 64
  weighted = [c for c in plan['communication'] if c.get('of') == 'weights']
  assert weighted and all(c['kind'] == 'sum' for c in weighted)


def tampered(source: Path, tmp_path: Path, edit) -> Path:
  copy = tmp_path / 'tampered'
  shutil.copytree(source, copy)
  plan = json.loads((copy / 'plan.json').read_text())
  edit(plan)
  (copy / 'plan.json').write_text(json.dumps(plan))
  return copy


def set_kind(plan):
  next(c for c in plan['communication'] if c['kind'] == 'sum')['kind'] = 'median'


def shrink_input(plan):
  spec = next(d for d in plan['programs']['client']['inputs'] if d['name'] == 'batches.inputs')
  spec['shape'][-1] += 1


def shrink_state(plan):
  spec = next(d for d in plan['inputs'] if d['name'].startswith('state.params'))
  spec['shape'][0] += 1


@pytest.mark.parametrize('edit, message', [
    (set_kind, "unknown aggregation 'median'"),
    (shrink_input, 'client input batches.inputs'),
    (shrink_state, 'state.params.'),
])
def test_tampered_plan_is_refused_with_one_line(fedavg_export, tmp_path, edit, message):
  proc = executor(tampered(fedavg_export, tmp_path, edit), '--rounds=1')
  assert proc.returncode == 2 and proc.stdout == ''
  assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr


# What `import paxlike` runs before anything else (the XLA:CPU pool's size; the stdlib alone).
ROOT_IMPORTS = ('paxlike.core', 'paxlike.core.cpu_pool')


def test_executor_imports_no_experiment_code(fedavg_export):
  script = (f'import sys\nfrom paxlike.export import run\n'
            f'run.run_rounds(run.load({str(fedavg_export)!r}), 1)\n'
            'print(sorted(m for m in sys.modules if m.split(".")[0] in '
            '("fiddle", "flax", "optax") or '  # paxlike.experiments, paxlike.configs below.
            'm.startswith("paxlike.") and not m.startswith("paxlike.export") '
            f'and m not in {ROOT_IMPORTS!r}))')
  proc = subprocess.run([sys.executable, '-c', script], cwd=REPO, env=cli_env(), text=True,
                        capture_output=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip() == '[]'
