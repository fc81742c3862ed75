"""The ServerApp's uplink (server_app._uplink) under SecAgg+, one round at a time over the
in-process stand-in Grid (tests/deploy/local_grid.py, Flower's own secaggplus_mod and workflow):
when a node is lost during the round, SecAgg+ runs again among the others, and a plain mean (the
clients' learning rate, 0.1 on every client) is their sum divided by the slots still held, as
the plain path's mean over the replies, not by the cohort's slots (issue 72.5: before, only the
end-to-end test reached that line, with a tolerance on loss and accuracy that could not tell).
A loss that leaves 2 nodes stops the run instead: SecAgg+ over 2 hides nothing between them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from paxlike.config import config_io
from paxlike.data import sources
from paxlike.deploy.flower import membership, once, records, rounds, server_app
from paxlike.export import run as executor
from paxlike.export.__main__ import export_experiment
from tests.deploy.local_grid import FIRST_NODE, LocalGrid
from tests.export.export_task import digits

NODES, CLIENTS = 4, 6  # Nodes 0 and 1 hold two clients, 2 and 3 one.


@pytest.fixture(autouse=True)
def _flower_task_identity(monkeypatch):
  monkeypatch.setattr(TaskIdentity, '_run_id', 1)  # Flower's Message needs a run and a node.
  monkeypatch.setattr(TaskIdentity, '_node_id', 0)
  monkeypatch.setattr(TaskIdentity, '_task_id', 1)


@pytest.fixture(scope='module')
def exported(tmp_path_factory) -> tuple[object, Path, Path]:
  """(DigitsFedAvg with 6 clients, 3 a round; its one-round export; its saved config)."""
  root = tmp_path_factory.mktemp('uplink')
  cfg = digits()
  config_io.apply_overrides(cfg, [f'data.num_clients={CLIENTS}', 'train.num_steps=1'])
  export_experiment(cfg, root / 'export', rounds=1, experiment='uplink')
  (root / 'config.json').write_text(config_io.to_json(cfg))
  return cfg, root / 'export', root / 'config.json'


def _uplink(exported, tmp_path: Path, secure: bool, lost: int, step: int = 1,
            nodes: int = NODES):
  """Round `step`'s uplink on `nodes` in-process nodes, node `lost` answering nothing from its
  first message of the round on: (the aggregates, what the round did, the cohort)."""
  cfg, export, config = exported
  tmp_path.mkdir()
  task = config_io.build(cfg)
  contexts = {FIRST_NODE + k: SimpleNamespace(state=RecordDict(), node_config={
      'export-dir': str(export), 'config': str(config), 'log': str(tmp_path / f'node{k}.jsonl'),
      'clients': ','.join(map(str, clients))})
      for k, clients in enumerate(rounds.clients_of_nodes(CLIENTS, nodes))}
  grid = LocalGrid(contexts, {lost: step}, secure)
  ex = executor.load(export)
  identity = {'config_sha256': ex.plan['config_sha256'],
              'plan_sha256': membership.file_sha256(export / 'plan.json')}
  members = membership.Members(grid, identity, CLIENTS, tmp_path / 'nodes.jsonl')
  members.wait_for(CLIENTS, 60)
  sizes = members.sizes
  cohort = records.cohort(task.data, task.train.seed, step, sizes, members.live())
  draw = rounds.Draw(cohort, members.live(), rounds.padded_slots_run(task.data))
  spec = ex.plan['programs']['server_pre']
  rng = next(s['name'] for s in ex.plan['inputs'] if s.get('key'))
  env = {**ex.carried, rng: rounds.rng_key_data(task.train.seed, step, ex.plan['key_impl'])}
  env.update(rounds.named_outputs(spec, ex.programs['server_pre'].call(
      *rounds.program_args(spec, env))))
  scale = (float(sources.cohort_weights(sizes, cohort, task.data.sampling).sum())
           if secure else None)
  context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
  aggregated, done, _ = server_app._uplink(ex, grid, context, members, env, draw, step, 60,
                                           scale, once.Sent(ex.plan))
  return aggregated, done, cohort


def test_a_secure_plain_mean_with_a_lost_nodes_slots_is_divided_by_the_slots_held(exported,
                                                                                  tmp_path):
  ex = executor.load(exported[1])
  (mean,) = [e['result'] for e in ex.plan['communication'] if e['kind'] == 'mean']
  task = config_io.build(exported[0])
  first = sources.sample_cohort(task.train.seed, 1, task.data.client_sizes, 3, 'uniform')
  lost = FIRST_NODE + int(first[0]) % NODES  # The node of round 1's first slot.
  plain, plain_done, cohort = _uplink(exported, tmp_path / 'plain', False, lost)
  secure, done, _ = _uplink(exported, tmp_path / 'secure', True, lost)
  assert cohort.tolist() == first.tolist()
  on_lost = [s for s, c in enumerate(cohort) if FIRST_NODE + int(c) % NODES == lost]
  assert on_lost and len(on_lost) < len(cohort)  # The loss drops some slots, not all.
  assert done['dropped_slots'] == plain_done['dropped_slots'] == on_lost
  assert done['secagg_attempts'] == 2  # SecAgg+ halted, then ran among the nodes left.
  held = len(cohort) - len(on_lost)
  bound = done['secagg_mean_error_bound']
  np.testing.assert_allclose(float(plain[mean]), 0.1, rtol=1e-6)  # Every client's rate.
  assert abs(float(secure[mean]) - float(plain[mean])) <= bound + 1e-7, (secure[mean], bound)
  # Divided by the cohort's slots instead, it would be off by far more than the bound.
  assert abs(float(plain[mean]) * held / len(cohort) - float(plain[mean])) > 100 * bound


def test_a_secure_round_left_with_two_nodes_stops_the_run_in_one_line(exported, tmp_path):
  """3 nodes, one lost during round 1: SecAgg+ halts, and running it again among the other two
  would let each learn the other's contribution (the sum less its own), so the round fails.
  Before: it ran again among the two (secagg_attempts 2)."""
  with pytest.raises(RuntimeError) as stopped:
    _uplink(exported, tmp_path / 'secure', True, FIRST_NODE + 1, nodes=3)
  message = str(stopped.value)
  assert message == ('round 1: 2 of the nodes left for SecAgg+, which needs 3 to hide a node\'s '
                     'contribution from the others; the run stops at its last checkpoint')
