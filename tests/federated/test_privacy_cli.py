"""The DP, FedProx and SCAFFOLD experiments through the CLI: they train, DP rows carry ε, and
bad privacy or cohort settings are one-line exit-2 errors that write nothing (every DP field's
check is in test_dp.py; here one per place that checks: the config, setup, the task)."""

import math

import pytest

from paxlike import registry
from paxlike.config import config_io
from paxlike.data import LmData
from paxlike.trainer import privacy
from tests.helpers import metric_rows, run_cli

pytestmark = pytest.mark.slow

ROUNDS = ['--fdl_set=train.num_steps=2', '--fdl_set=train.log_every=1',
          '--fdl_set=train.eval_every=2', '--fdl_set=train.checkpoint_every=2']
ONE_LAYER = ['--fdl_set=model.num_layers=1']
# ShakespeareDpFedAvg with 1 local step, not 4: its DP (clip, noise, ε) is per round, whatever
# the clients do in it, and its cohort of every role makes each local step dear. Its fixed
# cohort is all 147 roles of the full text; here all roles of the suite's slice (see `cohort`).
EXPERIMENTS = {'ShakespeareDpFedAvg': [*ONE_LAYER, '--fdl_set=data.local_steps=1'],
               'DigitsDpFedAvg': [],
               'ShakespeareFedProx': ONE_LAYER,
               'DigitsScaffold': ['--fdl_set=train.personalize_steps=2']}


@pytest.mark.parametrize('name', EXPERIMENTS)
def test_experiment_trains(name, tmp_path):
  overrides = [*EXPERIMENTS[name], *cohort(name)]
  run_cli(f'--exp=federated.{name}', *ROUNDS, *overrides, f'--job_log_dir={tmp_path}')
  rows = metric_rows(tmp_path)
  assert [r['step'] for r in rows] == [1, 2] and all(math.isfinite(r['loss']) for r in rows)
  assert rows[-1]['eval_loss'] < 10
  if 'Dp' in name:
    acc = privacy.accountant(_task(name, overrides))
    assert [(r['dp_epsilon'], r['dp_delta']) for r in rows] == [
        (acc.epsilon(1), acc.delta), (acc.epsilon(2), acc.delta)]
    assert 0 < rows[0]['dp_epsilon'] < rows[1]['dp_epsilon']
    assert rows[-1]['dp_clip_norm'] > 0
  if name == 'DigitsScaffold':
    assert {'eval_personalized_loss_mean', 'eval_personalized_accuracy_p10'} <= set(rows[-1])


def cohort(name: str) -> list[str]:
  """ShakespeareDpFedAvg's fixed cohort of every role of the data root's text."""
  if name != 'ShakespeareDpFedAvg':
    return []
  roles = LmData(dataset='shakespeare', partition='natural').describe()['population']
  return [f'--fdl_set=data.clients_per_round={roles}']


def _task(name: str, overrides: list[str] = ()):
  registry.import_all()
  cfg = registry.get(f'federated.{name}')().config()
  config_io.apply_overrides(cfg, [o.removeprefix('--fdl_set=') for o in overrides])
  return config_io.build(cfg)


def test_print_config_states_the_runs_epsilon():
  out = run_cli('--exp=federated.DigitsDpFedAvg', '--mode=print_config').stdout
  acc = privacy.accountant(_task('DigitsDpFedAvg'))
  assert out.splitlines()[-1] == acc.describe(100)
  assert out.splitlines()[-1].startswith(f'dp: epsilon {acc.epsilon(100):.4g} at delta 1e-05 '
                                         'after 100 rounds (rdp, without_replacement sampling')


def _over_budget() -> str:
  return f'would spend epsilon {privacy.accountant(_task("DigitsDpFedAvg")).epsilon(100):.4g} > '


BAD = {
    'negative noise': ('DigitsDpFedAvg', 'algorithm.aggregator.noise_multiplier=-1.0',
                       'noise_multiplier must be >= 0'),
    'delta of 1': ('DigitsDpFedAvg', 'algorithm.aggregator.delta=1.0', 'delta must be in (0, 1)'),
    'over budget': ('DigitsDpFedAvg', 'algorithm.aggregator.max_epsilon=1.0', _over_budget),
    'sampled scaffold': ('DigitsScaffold', "data.sampling='uniform'", "set data.sampling='fixed'"),
}


@pytest.mark.parametrize('case', BAD)
def test_bad_input_is_one_line_exit_2(case, tmp_path):
  name, override, message = BAD[case]
  message = message if isinstance(message, str) else message()
  job = tmp_path / 'job'
  proc = run_cli(f'--exp=federated.{name}', f'--fdl_set={override}', f'--job_log_dir={job}',
                 check=False)
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
  assert lines[0].startswith('paxlike: error: ') and message in lines[0]
  assert not job.exists()
