"""`--secure_aggregation`: the plan's sums through Flower's SecAgg+ (secure.py). Fast: what a
node sends and how the server reads the unmasked sum, through Flower's own quantization, stay
within `sum_error_bound`; plans whose clients keep individual values are refused in one line.
Slow: one DigitsFedAvg round on two nodes through the SecAgg+ workflow and mods equals the
reference executor's within the bound that quantization leaves, and differs from it (the sums
really were quantized)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.common.secure_aggregation.quantization import dequantize, quantize

from paxlike.deploy.flower import rounds, secure
from paxlike.export import run as executor
from tests.deploy import flower_procs as fp
from tests.helpers import REPO, cli_env

PLAN = {'algorithm': 'fed_avg',
        'programs': {'client': {'outputs': [
            {'name': 'up.0', 'shape': [3], 'dtype': 'float32'},
            {'name': 'up.1', 'shape': [], 'dtype': 'float32'},
            {'name': 'up.2', 'shape': [], 'dtype': 'int32'}]}},
        'communication': [{'kind': 'sum', 'value': 'up.0', 'result': 'agg.0'},
                          {'kind': 'sum', 'value': 'up.1', 'result': 'agg.1'},
                          {'kind': 'mean', 'value': 'up.1', 'result': 'agg.2'},
                          {'kind': 'sum', 'value': 'up.2', 'result': 'agg.3'}]}


def _unmasked_sum(sent: list[list[np.ndarray]]) -> list[np.ndarray]:
  """What SecAggPlusWorkflow hands its strategy for nodes that sent `sent` (weight 1 each),
  times the nodes: Flower's stochastic quantization, the integer sum the masks leave, then
  dequantization less the nodes' shifts."""
  c, q, n = secure.CLIPPING_RANGE, secure.QUANTIZATION_RANGE, len(sent)
  quantized = [quantize(values, c, q) for values in sent]
  total = [sum(node[i].astype(np.int64) for node in quantized) % secure.MODULUS_RANGE
           for i in range(len(sent[0]))]
  return [np.asarray(v) - (n - 1) * c for v in dequantize(total, c, q)]


def test_the_sum_through_flowers_quantization_is_within_the_bound():
  rng = np.random.default_rng(0)
  slots = [{'up.0': rng.normal(size=3).astype(np.float32) * 50, 'up.1': np.float32(w),
            'up.2': np.int32(1)} for w in (288, 100, 35)]
  scale = 423.0  # The cohort's total weight.
  sent = [secure.node_sum(PLAN, slots[:2], scale), secure.node_sum(PLAN, slots[2:], scale)]
  assert all(a.ndim >= 1 for node in sent for a in node)  # 0-d values travel as (1,).
  got = secure.aggregates(PLAN, _unmasked_sum(sent), 3, scale)
  exact = rounds.aggregates(PLAN, slots)
  bound = secure.sum_error_bound(2, scale)
  assert bound == pytest.approx(2 * 128 / 2**27 * scale)
  for name in ('agg.0', 'agg.1', 'agg.3'):
    assert got[name].shape == exact[name].shape and got[name].dtype == exact[name].dtype
    assert np.max(np.abs(got[name].astype(np.float64) - exact[name])) <= bound, name
  assert abs(float(got['agg.2']) - float(exact['agg.2'])) <= bound / 3
  assert got['agg.3'] == 3  # Integer sums come back exact.


def test_a_value_outside_the_clipping_range_is_refused_in_one_line():
  slot = {'up.0': np.float32([1, 2, 3]), 'up.1': np.float32(65), 'up.2': np.int32(1)}
  with pytest.raises(ValueError) as error:
    secure.node_sum(PLAN, [slot], 1.0)
  assert 'up.1' in str(error.value) and '\n' not in str(error.value)


def test_plans_whose_clients_keep_individual_values_are_refused_in_one_line():
  assert secure.refusal(PLAN) is None
  plan = json.loads(json.dumps(PLAN))
  plan['algorithm'] = 'scaffold'
  plan['programs']['client']['outputs'].append({'name': 'state.client_controls.w',
                                                'shape': [3], 'dtype': 'float32'})
  reason = secure.refusal(plan)
  assert reason is not None and 'scaffold' in reason and 'state.client_controls.w' in reason
  assert '\n' not in reason


CLI_TINY = fp.CLI_TINY


def _python(*args: str, timeout: float) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-m', *args], cwd=REPO, env=cli_env(), text=True,
                        capture_output=True, timeout=timeout)


@pytest.fixture(scope='module')
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
  return fp.digits_export(tmp_path_factory)  # Its first round is the one run here.


@pytest.mark.slow  # SecAgg+'s four stages, each a ClientApp process per node.
def test_a_secure_round_equals_the_executor_within_the_quantization_bound(export, tmp_path):
  out = tmp_path / 'run'
  ran = _python('paxlike.deploy.flower.local', *CLI_TINY, f'--export_dir={export}',
                f'--out={out}', '--rounds=1', '--nodes=2', '--round_timeout=180',
                '--server_restarts=0', '--secure_aggregation', timeout=900)
  assert ran.returncode == 0, ran.stderr[-3000:]
  assert 'Secure aggregation completed' in (out / 'logs' / 'flwr_run0.log').read_text()
  ex = executor.load(export)
  (expected,) = executor.run_rounds(ex, 1)
  (cohort,) = [json.loads(line) for line in (out / 'server' / 'cohorts.jsonl').read_text()
               .splitlines()]
  total_weight = float(ex.rounds['weights'][0].sum())
  down = [e for e in ex.plan['communication'] if e['kind'] in executor.DOWN]
  slots = len(cohort['cohort'])  # SecAgg+'s fit messages carry every down value to each slot.
  extra = cohort['bytes_down'] - slots * ex.plan['download_bytes_per_client']
  assert 0 <= extra <= slots * len(down) * 256  # The serialized arrays' headers.
  assert cohort['secagg_sum_error_bound'] == pytest.approx(2 * 128 / 2**27 * total_weight)
  # FedAvg divides each weighted sum by the weights' sum (both off by at most the bound), so
  # a parameter or a weighted-mean metric v is off by at most bound / weight × (1 + |v|).
  relative = cohort['secagg_sum_error_bound'] / total_weight
  with np.load(out / 'server' / 'final.npz') as final:
    worst = 0.0
    for name in final.files:
      diff = np.abs(final[name].astype(np.float64) - expected[name])
      allowed = 2 * relative * (1 + np.abs(expected[name])) + 1e-6 * np.abs(expected[name])
      assert np.all(diff <= allowed), (name, float(np.max(diff - allowed)))
      worst = max(worst, float(np.max(diff)))
  assert worst > 0  # The sums were quantized: SecAgg+ carried them, not the plain path.
  (row,) = [json.loads(line) for line in (out / 'server' / 'metrics.jsonl').read_text()
            .splitlines()]
  for name in ('loss', 'accuracy'):
    value = float(expected[f'metrics.{name}'])
    assert abs(row[name] - value) <= 2 * relative * (1 + abs(value)) + 1e-6, name


def test_the_launcher_refuses_a_plan_secagg_cannot_sum(export, tmp_path):
  tampered = tmp_path / 'export'
  shutil.copytree(export, tampered)
  plan = json.loads((tampered / 'plan.json').read_text())
  kept = next(e for e in plan['communication'] if e['kind'] == 'sum')
  plan['communication'] = [e for e in plan['communication'] if e['value'] != kept['value']]
  (tampered / 'plan.json').write_text(json.dumps(plan))
  ran = _python('paxlike.deploy.flower.local', *CLI_TINY, f'--export_dir={tampered}',
                f'--out={tmp_path / "run"}', '--rounds=1', '--nodes=2', '--secure_aggregation',
                timeout=300)
  assert ran.returncode == 2
  assert kept['value'] in ran.stderr and len(ran.stderr.strip().splitlines()) == 1
  assert not (tmp_path / 'run').exists()
