"""A DigitsFedAvg export run by a local Flower federation (a SuperLink over TLS with node
authentication and two SuperNodes, separate processes) through the faults a federation meets:
an enrolled node of another experiment joins (refused at its first message), the ServerApp is
killed with SIGKILL once round 1 is checkpointed (the launcher stops the dead run and submits
the app again; it resumes from that checkpoint) and SuperNode 1 is killed with SIGKILL after
round 2 (the launcher unregisters it). Rounds 1-2 equal the reference executor's uninterrupted
rounds; a round during which the node is lost drops its slots (weight 0, the simulation's
dropped straggler), and every later cohort is re-drawn among the clients still connected; each
round equals the executor on the cohort its row records."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from paxlike.config import config_io
from paxlike.data import sources
from paxlike.deploy.flower import certs, processes
from paxlike.export import run as executor
from tests.deploy import flower_procs as fp
from tests.deploy.reference import assert_rows_equal, executor_rounds
from tests.helpers import TIMING_FIELDS, cli_env, metric_rows, run_cli

pytestmark = pytest.mark.slow  # Flower processes, a ClientApp process per message, two kills.

CLI_TINY = fp.CLI_TINY
ROUNDS, NODES, LOST_NODE = fp.EXPORT_ROUNDS, 2, 1
LOST = {c for c in range(5) if c % NODES == LOST_NODE}  # Node k holds k, k + NODES, ...


def _start_intruder(out: Path, export: Path) -> subprocess.Popen:
  """An enrolled SuperNode whose config is another experiment's (one more client), its
  ClientApp processes forked by the federation's warm server too, not a fresh `flwr-clientapp`
  per message (seconds each, which the ServerApp's queries of it wait on)."""
  cfg = config_io.load_file(out / 'config.json')
  config_io.apply_overrides(cfg, ['data.num_clients=6'])
  other = out / 'other_config.json'
  other.write_text(config_io.to_json(cfg))
  assert other.read_text() != (out / 'config.json').read_text()
  private, public = certs.make_node_key(out / 'intruder_keys', 'other')
  enrolled = fp.flwr('supernode', 'register', str(public), 'local', home=out / 'flwr_home')
  assert enrolled.returncode == 0, enrolled.stdout + enrolled.stderr
  address = (out / 'flwr_home' / 'config.toml').read_text().split('address = "')[1].split('"')[0]
  node_config = (f'export-dir="{export}" config="{other}" clients="5" '
                 f'log="{out}/other.jsonl"')
  # The launcher's environment (cli_env) with its warm shim first on PATH: the warm server
  # refuses a caller whose import-time variables differ from its own.
  env = {**processes.flower_env(out / 'flwr_home', out / 'warm_bin'),
         **{k: v for k, v in cli_env().items() if k in ('PYTHONPATH', 'XLA_FLAGS')}}
  return fp.start_group([str(Path(sys.executable).parent / 'flower-supernode'),
                         '--root-certificates', str(out / 'credentials' / 'ca.crt'),
                         '--auth-supernode-private-key', str(private), '--superlink', address,
                         '--port', str(processes.free_port()), '--node-config', node_config],
                        out.parent / 'other_node.log', env)


@pytest.fixture(scope='module')
def federation(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, float]:
  """(the export dir, the Flower run's dir, when it began in clock ticks) of one 4-round run."""
  root = tmp_path_factory.mktemp('flower')
  export, out, began = fp.digits_export(tmp_path_factory), root / 'run', fp.now_ticks()
  launcher = fp.start_group([sys.executable, '-m', 'paxlike.deploy.flower.local', *CLI_TINY,
                             f'--export_dir={export}', f'--out={out}', f'--rounds={ROUNDS}',
                             f'--nodes={NODES}', '--round_timeout=90'], root / 'launcher.log')
  intruder = None
  try:
    fp.wait_until(lambda: (out / 'logs' / 'node1.log').exists(), 120, 'the nodes', launcher)
    intruder = _start_intruder(out, export)
    metrics = out / 'server' / 'metrics.jsonl'
    fp.wait_until(lambda: (out / 'server' / 'checkpoints' / '1').exists(), 300,
                  'round 1\'s checkpoint', launcher)
    fp.kill_server_app(out)
    fp.wait_until(lambda: len(fp.rows(metrics)) >= 2, 300, 'round 2 after the restart', launcher)
    fp.kill_node(out, f'node{LOST_NODE}')
    assert launcher.wait(timeout=600) == 0, (root / 'launcher.log').read_text()[-3000:]
  finally:
    fp.stop_group(launcher)
    if intruder is not None:
      fp.stop_group(intruder)
  return export, out, began


def test_rows_and_state_equal_the_executor_through_both_kills(federation):
  export, out, _ = federation
  rows = fp.rows(out / 'server' / 'metrics.jsonl')
  cohorts = fp.rows(out / 'server' / 'cohorts.jsonl')
  assert [r['step'] for r in rows] == [c['step'] for c in cohorts] == list(range(1, ROUNDS + 1))
  task = config_io.build(config_io.load_file(out / 'config.json'))
  simulated = [sources.sample_cohort(task.train.seed, c['step'], task.data.client_sizes, 3,
                                     'uniform').tolist() for c in cohorts]
  live = sorted(set(range(5)) - LOST)
  for r, row in enumerate(cohorts):
    on_lost = [s for s, c in enumerate(row['cohort']) if c in LOST]
    if r < 2:  # Before the kill: the simulation's cohort, every slot run.
      assert (row['cohort'], row['dropped_slots'], row['live_clients']) == (
          simulated[r], [], list(range(5)))
    elif row['dropped_slots']:  # The node was lost during this round: its slots dropped.
      assert r == 2 and row['cohort'] == simulated[r] and row['dropped_slots'] == on_lost
    else:  # Drawn among the clients still connected.
      assert (on_lost, row['live_clients'], len(set(row['cohort']))) == ([], live, 3)
  assert any(c in LOST for c in simulated[3]) and cohorts[3]['cohort'] != simulated[3]
  assert [r['nodes'] for r in rows] == [2, 2, 1, 1]
  assert [r['clients_lost'] for r in rows] == [0, 0, len(LOST), len(LOST)]
  assert [r['dropped_slots'] for r in rows] == [len(c['dropped_slots']) for c in cohorts]
  expected = executor_rounds(task, export, cohorts)
  assert_rows_equal(rows, expected)
  assert {'steps_per_sec', 'clients_lost'} <= set(rows[0])  # The trainer's row format, and ours.
  with np.load(out / 'server' / 'final.npz') as final:
    assert sorted(final.files) == sorted(executor.load(export).carried)
    for name in final.files:
      np.testing.assert_allclose(final[name], expected[-1][name], rtol=1e-5, atol=1e-6,
                                 err_msg=name)


def test_the_server_app_was_restarted_and_resumed_from_its_checkpoint(federation):
  _, out, _ = federation
  assert (out / 'logs' / 'flwr_run1.log').exists()  # The app was submitted a second time.
  joined = [e for e in fp.rows(out / 'server' / 'nodes.jsonl') if e['event'] == 'joined']
  assert len(joined) == 2 * NODES  # Each ServerApp asked the nodes once.
  assert sorted(int(p.name) for p in (out / 'server' / 'checkpoints').iterdir()
                if p.name.isdigit())[-1] == ROUNDS
  # Round 1 ran once: the second app began at its checkpoint (the first may have sent round 2
  # before the kill, so round 2 may run twice).
  steps = [[e['step'] for e in fp.rows(out / 'logs' / f'node{k}.jsonl')] for k in range(NODES)]
  assert sum(s.count(1) for s in steps) == len([s for s in steps if 1 in s]) >= 1, steps
  events = (out / 'logs' / 'supervisor.log').read_text()
  assert 'exited; stopped: True' in events  # Stopped at once, not after Flower's heartbeat.
  assert f'node node{LOST_NODE} exited (-9); unregistered' in events


def test_each_node_ran_only_its_own_clients_and_the_killed_node_no_more(federation):
  _, out, _ = federation
  cohorts = {c['step']: c for c in fp.rows(out / 'server' / 'cohorts.jsonl')}
  for k in range(NODES):
    for entry in fp.rows(out / 'logs' / f'node{k}.jsonl'):
      assert all(c % NODES == k for c in entry['clients']), (k, entry)
      assert [cohorts[entry['step']]['cohort'][s] for s in entry['slots']] == entry['clients']
      assert k != LOST_NODE or entry['step'] <= 2


def test_a_node_of_another_experiment_is_refused_in_one_line_and_the_run_goes_on(federation):
  _, out, _ = federation
  refused = [e for e in fp.rows(out / 'server' / 'nodes.jsonl') if e['event'] == 'refused']
  assert refused and all('config_sha256' in e['reason'] and '\n' not in e['reason']
                         for e in refused)
  assert not (out / 'other.jsonl').exists()  # It was never sent work.


def test_no_flower_process_outlives_the_run(federation):
  _, out, began = federation
  assert [cmd for _, cmd, _ in fp.processes().values() if str(out) in cmd] == []
  assert fp.flower_processes_since(began) == []


def test_every_clientapp_process_was_forked_by_the_warm_server(federation):
  """The nodes' ClientApp processes (Flower logs one start line each), the intruder's too, were
  the warm server's forks, none the real flwr-clientapp (the shim's fallback), through both
  kills."""
  _, out, _ = federation
  server = (out / 'logs' / 'warm_clientapp.log').read_text()
  nodes = ''.join((out / 'logs' / f'node{k}.log').read_text() for k in range(NODES))
  nodes += (out.parent / 'other_node.log').read_text()
  forked = [line for line in server.splitlines() if line.startswith('forked ')]
  assert 'not forked' not in nodes and 'refused' not in server
  assert len(forked) == nodes.count('Start `flwr-clientapp` process') > 2 * NODES


def test_the_uninterrupted_rounds_equal_the_simulations_own_rows(federation, tmp_path):
  """Rounds 1-2 (before the node was killed; the second after the ServerApp's restart) against
  `python -m paxlike.main` on the same experiment and seed, row by row."""
  _, out, _ = federation
  job = tmp_path / 'job'
  run_cli(*CLI_TINY, f'--job_log_dir={job}', '--fdl_set=train.num_steps=2',
          '--fdl_set=train.log_every=1', '--fdl_set=train.eval_every=100', timeout=300)
  simulated = metric_rows(job)
  deployed = fp.rows(out / 'server' / 'metrics.jsonl')[:2]
  assert [r['step'] for r in simulated] == [r['step'] for r in deployed] == [1, 2]
  for sim, dep in zip(simulated, deployed):
    shared = set(sim) & set(dep) - TIMING_FIELDS - {'step'}
    assert {'loss', 'accuracy', 'pseudo_grad_norm', 'clients'} <= shared
    for key in shared:
      np.testing.assert_allclose(dep[key], sim[key], rtol=1e-5, atol=1e-6, err_msg=key)
