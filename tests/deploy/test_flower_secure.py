"""`--secure_aggregation`: the plan's sums through Flower's SecAgg+ (secure.py). Fast: what a
node sends and how the server reads the unmasked sum, through Flower's own quantization, stay
within `sum_error_bound`; plans whose clients keep individual values are refused in one line.
Slow, on one secure federation of four nodes (made once): its first DigitsFedAvg round through
the SecAgg+ workflow and mods equals the reference executor's within the bound that
quantization leaves, and differs from it (the sums really were quantized); a node killed during
its second round is left out and the round runs again among the other three. Federated LoRA
through SecAgg+ sends its frozen base once and equals the simulation."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flwr.common.secure_aggregation.quantization import dequantize, quantize

from paxlike.config import config_io
from paxlike.deploy.flower import rounds, secure
from paxlike.export import run as executor
from paxlike.trainer.checkpoint import Checkpoints
from tests.deploy import flower_procs as fp
from tests.deploy.reference import assert_rows_within_secagg_bound, executor_rounds
from tests.helpers import TIMING_FIELDS, cli_env, made_once, metric_rows, run_python

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
NODES = 4  # Node k holds clients k, k + NODES, ...: node 1 is the one killed, 3 stay.


def _python(*args: str, timeout: float) -> subprocess.CompletedProcess:
  return run_python(['-m', *args], cli_env(), timeout)  # Forked: the export and the launcher.


@pytest.fixture(scope='module')
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
  return fp.digits_export(tmp_path_factory)  # Its first two rounds are the ones run here.


def _run_and_kill_node1(root: Path, export: Path) -> None:
  """A secure federation of NODES nodes for 2 rounds in root/run: node 1 stops answering as
  round 2 begins (SIGSTOP, so it is certainly inside the round), then is killed with SIGKILL."""
  root.mkdir(parents=True)
  out, log = root / 'run', root / 'launcher.log'
  launcher = fp.start_group([sys.executable, '-m', 'paxlike.deploy.flower.local', *CLI_TINY,
                             f'--export_dir={export}', f'--out={out}', '--rounds=2',
                             f'--nodes={NODES}', '--round_timeout=120', '--server_restarts=0',
                             '--secure_aggregation'], log)
  try:
    fp.wait_until(lambda: len(fp.rows(out / 'server' / 'metrics.jsonl')) >= 1, 600, 'round 1',
                  launcher)
    fp.kill_node(out, 'node1', signal.SIGSTOP)
    # SecAgg+ logs this once per attempt: the second is round 2's, drawn with node 1's clients
    # before the stop was seen, so it now waits on node 1's answer.
    app_log = out / 'logs' / 'flwr_run0.log'
    fp.wait_until(lambda: app_log.read_text().count('Secure aggregation commencing') >= 2, 120,
                  'round 2\'s SecAgg+', launcher)
    fp.kill_node(out, 'node1')
    assert launcher.wait(timeout=600) == 0, log.read_text()[-3000:]
  finally:
    fp.stop_group(launcher)


@pytest.fixture(scope='module')
def federation(tmp_path_factory: pytest.TempPathFactory, export: Path) -> Path:
  """The run dir of `_run_and_kill_node1`, made once per pytest run: its round 1 (every node
  answering) is the secure round checked against the executor, its round 2 the one a node
  left."""
  made = made_once(tmp_path_factory, 'flower_secure_federation',
                   lambda root: _run_and_kill_node1(root, export))
  return made / 'run'


def _checkpointed_state(out: Path, step: int, like: dict[str, np.ndarray]
                        ) -> dict[str, np.ndarray]:
  """The ServerApp's state after round `step`, from its Orbax checkpoint of that round."""
  checkpoints = Checkpoints(out / 'server' / 'checkpoints', 2, read_only=True)
  try:
    restored = checkpoints.restore(
        {n: jax.ShapeDtypeStruct(v.shape, v.dtype) for n, v in like.items()}, step)
  finally:
    checkpoints.close()
  assert restored is not None and restored[0] == step
  return {n: np.asarray(v) for n, v in restored[1].items()}


@pytest.mark.slow  # SecAgg+'s four stages, each a ClientApp process per node.
def test_a_secure_round_equals_the_executor_within_the_quantization_bound(export, federation):
  out = federation
  assert 'Secure aggregation completed' in (out / 'logs' / 'flwr_run0.log').read_text()
  ex = executor.load(export)
  (expected,) = executor.run_rounds(ex, 1)
  cohort = fp.rows(out / 'server' / 'cohorts.jsonl')[0]
  assert cohort['secagg_attempts'] == 1 and cohort['dropped_slots'] == []
  total_weight = float(ex.rounds['weights'][0].sum())
  # SecAgg+'s fit messages carry what the plain path's would: each slot's scattered values, and
  # the broadcasts once per node that serves a slot (node k holds the clients k mod NODES).
  down = [e for e in ex.plan['communication'] if e['kind'] in executor.DOWN]
  per_copy = sum(e['bytes'] for e in down if e['kind'] == 'broadcast')
  slots, nodes = len(cohort['cohort']), len({c % NODES for c in cohort['cohort']})
  carried = slots * ex.plan['download_bytes_per_client'] - (slots - nodes) * per_copy
  assert per_copy > 0 and 0 <= cohort['bytes_down'] - carried <= slots * len(down) * 256
  # Every node takes part in the sum, each adding at most one quantization level (128 / 2^27).
  assert cohort['secagg_sum_error_bound'] == pytest.approx(NODES * 128 / 2**27 * total_weight)
  # FedAvg divides each weighted sum by the weights' sum (both off by at most the bound), so
  # a parameter or a weighted-mean metric v is off by at most bound / weight × (1 + |v|).
  relative = cohort['secagg_sum_error_bound'] / total_weight
  state = _checkpointed_state(out, 1, ex.carried)
  assert sorted(state) == sorted(ex.carried)
  worst = 0.0
  for name, value in state.items():
    diff = np.abs(value.astype(np.float64) - expected[name])
    allowed = 2 * relative * (1 + np.abs(expected[name])) + 1e-6 * np.abs(expected[name])
    assert np.all(diff <= allowed), (name, float(np.max(diff - allowed)))
    worst = max(worst, float(np.max(diff)))
  assert worst > 0  # The sums were quantized: SecAgg+ carried them, not the plain path.
  row = fp.rows(out / 'server' / 'metrics.jsonl')[0]
  for name in ('loss', 'accuracy'):
    value = float(expected[f'metrics.{name}'])
    assert abs(row[name] - value) <= 2 * relative * (1 + abs(value)) + 1e-6, name
  with np.load(out / 'server' / 'final.npz') as final:  # The last round's state.
    last = _checkpointed_state(out, 2, ex.carried)
    assert sorted(final.files) == sorted(last)
    for name in final.files:
      np.testing.assert_array_equal(final[name], last[name], err_msg=name)


@pytest.mark.slow  # Four nodes through SecAgg+ for two rounds, one of them run twice.
def test_a_node_killed_during_a_secure_round_is_left_out_and_the_round_runs_again(export,
                                                                                  federation):
  """Node 1 of 4, stopped inside round 2 and then killed (`_run_and_kill_node1`): the launcher
  unregisters it, SecAgg+ halts for want of its shares, and the ServerApp runs round 2 again
  among nodes 0, 2 and 3 with node 1's slots dropped. Both rounds equal the reference executor on
  the cohorts the rows record, within the quantization's bound."""
  out = federation
  cohorts = fp.rows(out / 'server' / 'cohorts.jsonl')
  rows = fp.rows(out / 'server' / 'metrics.jsonl')
  assert [c['secagg_attempts'] for c in cohorts] == [1, 2]
  assert cohorts[0]['dropped_slots'] == []
  assert cohorts[1]['dropped_slots'] == [s for s, c in enumerate(cohorts[1]['cohort'])
                                         if c % NODES == 1]
  lost = len([c for c in range(5) if c % NODES == 1])
  assert [r['nodes'] for r in rows] == [NODES, NODES - 1]
  assert [r['clients_lost'] for r in rows] == [0, lost]
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
                f'--out={tmp_path / "run"}', '--rounds=1', '--nodes=3', '--secure_aggregation',
                timeout=300)
  assert ran.returncode == 2
  assert kept['value'] in ran.stderr and len(ran.stderr.strip().splitlines()) == 1
  assert not (tmp_path / 'run').exists()


@pytest.mark.slow  # A secure federation of 3 nodes for two rounds (flower_procs.lora_run).
def test_secure_lora_rounds_send_the_base_once_and_equal_the_simulation(tmp_path_factory,
                                                                         tmp_path):
  """Federated LoRA on text through SecAgg+ (three clients, a file each, on three nodes): round
  2's fit messages carry none of the frozen base, which the nodes kept from round 1 (a node that
  lost it would fail round 2), and the rows equal `paxlike.main`'s within the quantization."""
  flags, export, job = fp.lora_run(tmp_path_factory)
  out = tmp_path / 'run'
  ran = _python('paxlike.deploy.flower.local', *flags, f'--export_dir={export}',
                f'--out={out}', f'--rounds={fp.LORA_ROUNDS}', f'--nodes={fp.LORA_CLIENTS}',
                '--round_timeout=180', '--server_restarts=0', '--secure_aggregation', timeout=900)
  assert ran.returncode == 0, ran.stderr[-3000:]
  plan = json.loads((export / 'plan.json').read_text())
  once = [e for e in plan['communication'] if e.get('once')]
  cohorts = fp.rows(out / 'server' / 'cohorts.jsonl')
  first, second = (c['bytes_down'] for c in cohorts)
  # Each node got the base in round 1 only (its bytes, plus the arrays' headers).
  nodes = fp.LORA_CLIENTS
  assert 0 <= first - second - nodes * plan['download_once_bytes'] <= nodes * 256 * len(once)
  simulated, deployed = metric_rows(job), fp.rows(out / 'server' / 'metrics.jsonl')
  assert [r['step'] for r in deployed] == [r['step'] for r in simulated] == [1, 2]
  for sim, dep, cohort in zip(simulated, deployed, cohorts):
    shared = set(sim) & set(dep) - TIMING_FIELDS - {'step'}
    assert {'loss', 'accuracy', 'clients', 'learning_rate'} <= shared, sorted(shared)
    # The clients' learning rate is a plain mean, scaled by the cohort's slots (not by its
    # total weight, thousands of tokens here, which left it 0): within its own bound.
    assert cohort['secagg_mean_error_bound'] == pytest.approx(
        secure.sum_error_bound(nodes, sim['clients']) / sim['clients'])
    assert sim['learning_rate'] > 1e3 * cohort['secagg_mean_error_bound']
    assert abs(dep['learning_rate'] - sim['learning_rate']) <= cohort['secagg_mean_error_bound']
    for key in shared - {'learning_rate'}:  # Weighted by the tokens: a level is ~1e-6 of each.
      np.testing.assert_allclose(dep[key], sim[key], rtol=1e-4, atol=1e-5, err_msg=key)


@pytest.mark.slow  # Three nodes through SecAgg+ for one round, then one node killed.
def test_a_secure_federation_left_with_two_nodes_stops_in_one_line(export, tmp_path):
  """3 nodes, node 1 killed with SIGKILL once round 1's row is written: round 2 would run
  SecAgg+ over the 2 nodes left, each of which would learn the other's contribution, so the
  ServerApp stops and the launcher exits 1 with one line saying why; round 1's checkpoint
  stays, and no Flower process is left. Before: round 2 ran again among the two, exit 0."""
  out, log, began = tmp_path / 'run', tmp_path / 'launcher.log', fp.now_ticks()
  launcher = fp.start_group([sys.executable, '-m', 'paxlike.deploy.flower.local', *CLI_TINY,
                             f'--export_dir={export}', f'--out={out}', '--rounds=2', '--nodes=3',
                             '--round_timeout=120', '--server_restarts=0',
                             '--secure_aggregation'], log)
  try:
    fp.wait_until(lambda: len(fp.rows(out / 'server' / 'metrics.jsonl')) >= 1, 600, 'round 1',
                  launcher)
    fp.kill_node(out, 'node1')
    code = launcher.wait(timeout=600)
  finally:
    fp.stop_group(launcher)
  text = log.read_text()
  assert code == 1, text[-3000:]
  line = text.strip().splitlines()[-1]
  assert line.startswith('paxlike.deploy.flower.local: failed: the ServerApp wrote 1 of 2 '
                         'rounds (ServerApp failed with exception: round 2: 2 of the nodes '
                         'left for SecAgg+, which needs 3 to hide a node\'s contribution'), line
  assert 'Traceback' not in text.split('paxlike.deploy.flower.local: failed')[-1]
  assert (out / 'server' / 'checkpoints' / '1').is_dir()
  assert [r['step'] for r in fp.rows(out / 'server' / 'metrics.jsonl')] == [1]
  assert fp.flower_processes_since(began) == []
