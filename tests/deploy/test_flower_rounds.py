"""The server side of a deployed round apart from Flower: what a slot is sent, how contributions
are reduced, the round key, which node holds which client, where the client state is kept,
which node runs which cohort slot, and which node is sent a once value."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import numpy as np
import pytest
from flwr.app import RecordDict

from paxlike.deploy.flower import client_state, once, rounds

PLAN = {'inputs': [], 'communication': [
    {'kind': 'scatter', 'value': 'down.0', 'axis': 1},
    {'kind': 'broadcast', 'value': 'down.1'},
    {'kind': 'sum', 'value': 'up.0', 'result': 'agg.0'},
    {'kind': 'sum', 'value': 'up.1', 'result': 'agg.1'},
    {'kind': 'mean', 'value': 'up.2', 'result': 'agg.2'}]}


def test_a_slot_gets_its_row_of_a_scatter_and_the_whole_broadcast():
  env = {'down.0': np.arange(12).reshape(2, 3, 2), 'down.1': np.ones(4), 'other': np.zeros(1)}
  sent = rounds.slot_down(PLAN, env, 2)
  assert sorted(sent) == ['down.0', 'down.1']
  np.testing.assert_array_equal(sent['down.0'], [[4, 5], [10, 11]])
  np.testing.assert_array_equal(sent['down.1'], np.ones(4))


def test_contributions_reduce_with_the_federated_dtypes():
  slots = [{'up.0': np.float32([1.5, 2.0]), 'up.1': np.bool_(True), 'up.2': np.int8(3)},
           {'up.0': np.float32([0.25, -1.0]), 'up.1': np.bool_(True), 'up.2': np.int8(4)}]
  out = rounds.aggregates(PLAN, slots)
  np.testing.assert_array_equal(out['agg.0'], np.float32([1.75, 1.0]))
  assert out['agg.0'].dtype == np.float32
  assert out['agg.1'] == 2 and out['agg.1'].dtype == np.int32  # Bools count, widened.
  assert out['agg.2'] == 3.5 and out['agg.2'].dtype == np.float32


def test_the_round_key_is_the_trainers_fold_in_of_the_seed():
  data = rounds.rng_key_data(7, 3, 'threefry2x32')
  expected = jax.random.key_data(jax.random.fold_in(jax.random.key(7), 3))
  assert data.dtype == np.uint32
  np.testing.assert_array_equal(data, np.asarray(expected))


def test_every_client_is_on_exactly_one_node():
  assert rounds.clients_of_nodes(5, 2) == [[0, 2, 4], [1, 3]]
  assert sorted(sum(rounds.clients_of_nodes(7, 3), [])) == list(range(7))


def test_client_state_is_never_sent_and_the_node_keeps_its_versions(tmp_path):
  plan = {'inputs': [{'name': 'state.params.w', 'placement': 'server', 'carried': True},
                     {'name': 'state.replicas.mu', 'placement': 'clients', 'carried': True},
                     {'name': 'weights', 'placement': 'clients', 'carried': False}],
          'communication': [{'kind': 'broadcast', 'value': 'state.params.w'}]}
  env = {'state.params.w': np.ones(2), 'state.replicas.mu': np.arange(6.0).reshape(3, 2),
         'weights': np.ones(3)}
  assert sorted(rounds.slot_down(plan, env, 1)) == ['state.params.w']  # Not mu, not weights.
  assert sorted(rounds.server_state(plan, env)) == ['state.params.w', 'weights']
  store = client_state.Store(tmp_path)
  for version in range(5):
    store.put(1, version, {'state.replicas.mu': np.float32([version, 0])})
  store.save()
  again = client_state.Store(tmp_path)  # A restarted node reads what was saved.
  assert again.held() == [(1, 2), (1, 3), (1, 4)]  # The last KEEP versions.
  np.testing.assert_array_equal(again.row(1, 3)['state.replicas.mu'], [3, 0])
  assert sorted(p.name for p in tmp_path.iterdir()) == ['client_state.npz']  # No temp left.


def test_a_handed_over_row_opens_only_for_its_node_slot_and_version(tmp_path):
  mine, other = client_state.node_key(tmp_path / 'a'), client_state.node_key(tmp_path / 'b')
  assert client_state.node_key(tmp_path / 'a').private_bytes_raw() == mine.private_bytes_raw()
  row = {'mu': np.arange(4.0)}
  blob = client_state.seal(row, client_state.public_hex(mine), 2, 7)
  assert blob.dtype == np.uint8 and np.arange(4.0).tobytes() not in blob.tobytes()
  np.testing.assert_array_equal(client_state.unseal(mine, blob, 2, 7)['mu'], row['mu'])
  from cryptography.exceptions import InvalidTag
  for key, slot, version in ((other, 2, 7), (mine, 1, 7), (mine, 2, 6)):
    with pytest.raises(InvalidTag):
      client_state.unseal(key, blob, slot, version)


def test_slots_go_to_their_clients_nodes_and_padded_ones_run_only_under_poisson():
  owner = {0: 10, 1: 11, 2: 10, 3: 11}  # client -> node
  cohort = np.array([3, 0, -1, 2, -1])
  by_node, dropped = rounds.slots_by_node(cohort, owner, padded_run=True)
  assert by_node == {11: [0, 2, 4], 10: [1, 3]} and dropped == []  # Padding: slot 0's node.
  by_node, dropped = rounds.slots_by_node(cohort, owner, padded_run=False)
  assert by_node == {11: [0], 10: [1, 3]} and dropped == [2, 4]
  by_node, dropped = rounds.slots_by_node(np.array([-1, -1]), owner, padded_run=True)
  assert by_node == {10: [0, 1]} and dropped == []  # No client: the lowest node id.
  assert rounds.slots_by_node(np.array([1, 0]), {0: 10}, True) == ({10: [1]}, [0])
  assert rounds.padded_slots_run(SimpleNamespace(sampling='poisson'))
  assert not rounds.padded_slots_run(SimpleNamespace(sampling='uniform'))


def test_a_once_value_goes_to_each_node_once_and_again_when_it_changes():
  plan = {'communication': [{'kind': 'broadcast', 'value': 'down.0', 'once': True},
                            {'kind': 'broadcast', 'value': 'down.1'}]}
  sent = once.Sent(plan)
  env = {'down.0': np.arange(3.0), 'down.1': np.ones(2)}
  assert list(sent.due(7, env)) == ['down.0'] and sent.due(7, env) == {}
  assert list(sent.due(8, env)) == ['down.0']  # Another node has not got it yet.
  changed = {**env, 'down.0': np.arange(3.0) + 1}
  np.testing.assert_array_equal(sent.due(8, changed)['down.0'], [1, 2, 3])
  assert list(sent.due(7, changed)) == ['down.0'] and sent.due(7, changed) == {}
  context = SimpleNamespace(state=RecordDict())  # A node keeps what it got between messages.
  assert once.kept(context, {}) == {}
  once.kept(context, {'down.0': np.arange(3.0)})
  np.testing.assert_array_equal(once.kept(context, {})['down.0'], np.arange(3.0))
