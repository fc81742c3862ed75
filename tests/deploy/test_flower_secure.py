"""`--secure_aggregation`: the plan's sums through Flower's SecAgg+ (secure.py). Fast: what a
node sends and how the server reads the unmasked sum, through Flower's own quantization, stay
within `sum_error_bound`; plans whose clients keep individual values are refused in one line.
Slow: one DigitsFedAvg round on two nodes through the SecAgg+ workflow and mods equals the
reference executor's within the bound that quantization leaves, and differs from it (the sums
really were quantized); a node killed during a secure round is left out and the round runs
again among the other two."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.common.secure_aggregation.quantization import dequantize, quantize

from paxlike.config import config_io
from paxlike.deploy.flower import rounds, secure
from paxlike.export import run as executor
from tests.deploy import flower_procs as fp
from tests.deploy.reference import assert_rows_within_secagg_bound, executor_rounds
from tests.federated.lora_task import SMALL, write_corpus
from tests.helpers import TIMING_FIELDS, cli_env, metric_rows, run_cli, run_python

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
  scales = secure.value_scales(PLAN, scale, 3)
  assert scales == {'up.0': scale, 'up.1': scale, 'up.2': scale}  # Each one is summed.
  sent = [secure.node_sum(PLAN, slots[:2], scales), secure.node_sum(PLAN, slots[2:], scales)]
  assert all(a.ndim >= 1 for node in sent for a in node)  # 0-d values travel as (1,).
  got = secure.aggregates(PLAN, _unmasked_sum(sent), 3, scales)
  exact = rounds.aggregates(PLAN, slots)
  bound = secure.sum_error_bound(2, scale)
  assert bound == pytest.approx(2 * 128 / 2**27 * scale)
  for name in ('agg.0', 'agg.1', 'agg.3'):
    assert got[name].shape == exact[name].shape and got[name].dtype == exact[name].dtype
    assert np.max(np.abs(got[name].astype(np.float64) - exact[name])) <= bound, name
  assert abs(float(got['agg.2']) - float(exact['agg.2'])) <= bound / 3
  assert got['agg.3'] == 3  # Integer sums come back exact.


def test_a_plain_mean_is_scaled_by_the_slots_not_by_a_total_weight_of_thousands():
  """A mean of the clients' learning rates beside sums weighted by tokens: divided by the
  total weight, 3 × 0.003 / 33,682 is a tenth of one quantization level and the mean comes
  back as 0 or a multiple of 0.01; divided by the cohort's 3 slots it keeps 6 digits."""
  plan = json.loads(json.dumps(PLAN))
  plan['programs']['client']['outputs'].append({'name': 'up.3', 'shape': [], 'dtype': 'float32'})
  plan['communication'].append({'kind': 'mean', 'value': 'up.3', 'result': 'agg.4'})
  weight, rates = 33_682.0, (0.003, 0.002, 0.004)
  scales = secure.value_scales(plan, weight, 3)
  assert scales == {'up.0': weight, 'up.1': weight, 'up.2': weight, 'up.3': 3.0}
  slots = [{'up.0': np.float32([1, 2, 3]), 'up.1': np.float32(10), 'up.2': np.int32(1),
            'up.3': np.float32(r)} for r in rates]
  sent = [secure.node_sum(plan, slots[:2], scales), secure.node_sum(plan, slots[2:], scales)]
  got = secure.aggregates(plan, _unmasked_sum(sent), 3, scales)
  mean_bound = secure.sum_error_bound(2, 3) / 3
  assert mean_bound < 2e-6 and abs(float(got['agg.4']) - np.mean(rates)) <= mean_bound


def test_a_value_outside_the_clipping_range_is_refused_in_one_line():
  slot = {'up.0': np.float32([1, 2, 3]), 'up.1': np.float32(65), 'up.2': np.int32(1)}
  with pytest.raises(ValueError) as error:
    secure.node_sum(PLAN, [slot], secure.value_scales(PLAN, 1.0, 1))
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
  return run_python(['-m', *args], cli_env(), timeout)  # The export forked; the launcher afresh.


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
  # SecAgg+'s fit messages carry what the plain path's would: each slot's scattered values, and
  # the broadcasts once per node that serves a slot (node k holds the clients k mod 2).
  down = [e for e in ex.plan['communication'] if e['kind'] in executor.DOWN]
  per_copy = sum(e['bytes'] for e in down if e['kind'] == 'broadcast')
  slots, nodes = len(cohort['cohort']), len({c % 2 for c in cohort['cohort']})  # 2 nodes.
  carried = slots * ex.plan['download_bytes_per_client'] - (slots - nodes) * per_copy
  assert per_copy > 0 and 0 <= cohort['bytes_down'] - carried <= slots * len(down) * 256
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


@pytest.mark.slow  # Three nodes through SecAgg+ for two rounds, one of them run twice.
def test_a_node_killed_during_a_secure_round_is_left_out_and_the_round_runs_again(export,
                                                                                  tmp_path):
  """Node 1 of 3 stops answering as round 2 begins (SIGSTOP, so it is certainly inside the
  round), then is killed with SIGKILL: the launcher unregisters it, SecAgg+ halts for want of
  its shares, and the ServerApp runs round 2 again among nodes 0 and 2 with node 1's slots
  dropped. Both rounds equal the reference executor on the cohorts the rows record, within the
  quantization's bound."""
  out, nodes = tmp_path / 'run', 3
  launcher = fp.start_group([sys.executable, '-m', 'paxlike.deploy.flower.local', *CLI_TINY,
                             f'--export_dir={export}', f'--out={out}', '--rounds=2',
                             f'--nodes={nodes}', '--round_timeout=120', '--server_restarts=0',
                             '--secure_aggregation'], tmp_path / 'launcher.log')
  try:
    metrics = out / 'server' / 'metrics.jsonl'
    fp.wait_until(lambda: len(fp.rows(metrics)) >= 1, 600, 'round 1', launcher)
    fp.kill_node(out, 'node1', signal.SIGSTOP)
    time.sleep(3)  # Round 2's SecAgg+ waits on the stopped node.
    fp.kill_node(out, 'node1')
    assert launcher.wait(timeout=600) == 0, (tmp_path / 'launcher.log').read_text()[-3000:]
  finally:
    fp.stop_group(launcher)
  cohorts, rows = fp.rows(out / 'server' / 'cohorts.jsonl'), fp.rows(metrics)
  assert [c['secagg_attempts'] for c in cohorts] == [1, 2]
  assert cohorts[0]['dropped_slots'] == []
  assert cohorts[1]['dropped_slots'] == [s for s, c in enumerate(cohorts[1]['cohort'])
                                         if c % nodes == 1]
  assert [r['nodes'] for r in rows] == [3, 2] and [r['clients_lost'] for r in rows] == [0, 2]
  assert 'node node1 exited (-9); unregistered' in (out / 'logs' / 'supervisor.log').read_text()
  task = config_io.build(config_io.load_file(out / 'config.json'))
  assert_rows_within_secagg_bound(task, rows, cohorts, executor_rounds(task, export, cohorts))


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


@pytest.mark.slow  # An export, a secure federation of two nodes for two rounds, a trainer run.
def test_secure_lora_rounds_send_the_base_once_and_equal_the_simulation(tmp_path):
  """Federated LoRA on text through SecAgg+ (two clients, a file each, on two nodes): round 2's
  fit messages carry none of the frozen base, which the nodes kept from round 1 (a node that
  lost it would fail round 2), and the rows equal `paxlike.main`'s within the quantization."""
  for k in range(2):
    (tmp_path / 'corpus' / str(k)).mkdir(parents=True)
    write_corpus(tmp_path / 'corpus' / str(k))
  flags = ['--exp=federated.TextLoraFedAvg', *(f'--fdl_set={o}' for o in SMALL),
           f'--fdl_set=data.files={tmp_path}/corpus/*/corpus.txt', '--fdl_set=data.partition=file',
           '--fdl_set=data.clients_per_round=2', '--fdl_set=train.num_steps=2']
  exported = _python('paxlike.export', *flags, f'--out={tmp_path / "export"}', '--rounds=2',
                     timeout=300)
  assert exported.returncode == 0, exported.stderr[-3000:]
  out = tmp_path / 'run'
  ran = _python('paxlike.deploy.flower.local', *flags, f'--export_dir={tmp_path / "export"}',
                f'--out={out}', '--rounds=2', '--nodes=2', '--round_timeout=180',
                '--server_restarts=0', '--secure_aggregation', timeout=900)
  assert ran.returncode == 0, ran.stderr[-3000:]
  run_cli(*flags, f'--job_log_dir={tmp_path / "job"}', timeout=300)
  plan = json.loads((tmp_path / 'export' / 'plan.json').read_text())
  once = [e for e in plan['communication'] if e.get('once')]
  cohorts = fp.rows(out / 'server' / 'cohorts.jsonl')
  first, second = (c['bytes_down'] for c in cohorts)
  # Each of the two nodes got the base in round 1 only (its bytes, plus the arrays' headers).
  assert 0 <= first - second - 2 * plan['download_once_bytes'] <= 2 * 256 * len(once)
  simulated, deployed = metric_rows(tmp_path / 'job'), fp.rows(out / 'server' / 'metrics.jsonl')
  assert [r['step'] for r in deployed] == [r['step'] for r in simulated] == [1, 2]
  for sim, dep, cohort in zip(simulated, deployed, cohorts):
    shared = set(sim) & set(dep) - TIMING_FIELDS - {'step'}
    assert {'loss', 'accuracy', 'clients', 'learning_rate'} <= shared, sorted(shared)
    # The clients' learning rate is a plain mean, scaled by the cohort's slots (not by its
    # total weight, thousands of tokens here, which left it 0): within its own bound.
    assert cohort['secagg_mean_error_bound'] == pytest.approx(
        secure.sum_error_bound(2, sim['clients']) / sim['clients'])
    assert sim['learning_rate'] > 1e3 * cohort['secagg_mean_error_bound']
    assert abs(dep['learning_rate'] - sim['learning_rate']) <= cohort['secagg_mean_error_bound']
    for key in shared - {'learning_rate'}:  # Weighted by the tokens: a level is ~1e-6 of each.
      np.testing.assert_allclose(dep[key], sim[key], rtol=1e-4, atol=1e-5, err_msg=key)
