"""Per-client held-out eval: which client each eval target belongs to, and the per-client
metrics computed from one pooled pass, against direct computations."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.trainer import evaluation
from paxlike.data import ImageData
from paxlike.data import LmData
from paxlike.data import lm
from paxlike.data.sources import ClientEval
from paxlike.errors import UserError
from paxlike.trainer.summaries import RunWriter


def test_lm_eval_targets_belong_to_the_role_whose_test_speech_they_are_in(prepared):
  data = LmData(dataset='shakespeare', partition='natural', min_client_chars=1000, seq_len=32,
                eval_batch_size=8, num_eval_batches=4)
  client_eval = data.client_eval()
  names = data.train_streams.names
  assert client_eval.names == names and np.array_equal(client_eval.mix, np.eye(len(names)))
  texts, roles = lm.read_documents('shakespeare', 'test')
  ends = np.cumsum([len(t) + 1 for t in texts])  # Each speech and its separator.
  stream = np.concatenate([np.append(t, lm.SEPARATOR) for t in texts])
  for batch, groups, offsets in zip(data.eval_batches(), client_eval.groups,
                                    data._eval_offsets()):
    for row, offset in enumerate(offsets):
      positions = (offset + np.arange(1, data.seq_len + 1)) % ends[-1]
      assert np.array_equal(batch['targets'][row], stream[positions])
      role = roles[np.searchsorted(ends, positions, side='right')]
      want = [names.index(r) if r in names else -1 for r in role]
      assert groups[row].tolist() == want
  grouped = np.concatenate([g.ravel() for g in client_eval.groups])
  assert (grouped >= 0).mean() > 0.9 and len(np.unique(grouped[grouped >= 0])) > len(names) // 2


def test_domain_clients_own_the_test_text_of_their_natural_clients(prepared):
  data = LmData(dataset='stdlib', partition='domains', num_clients=3, seq_len=64)
  client_eval = data.client_eval()
  assert len(client_eval.names) == 3
  grouped = np.concatenate([g.ravel() for g in client_eval.groups])
  assert set(np.unique(grouped)) <= {-1, 0, 1, 2} and {0, 1, 2} <= set(np.unique(grouped))
  assert LmData(dataset='stdlib', partition='iid', num_clients=3).client_eval() is None
  assert LmData(dataset='stdlib').client_eval() is None  # Pooled.


def test_image_client_mix_is_its_training_label_distribution(prepared):
  data = ImageData(dataset='digits', num_clients=6, partition='dirichlet', alpha=0.2,
                   eval_batch_size=100)
  client_eval = data.client_eval()
  for c, members in enumerate(data.clients):
    counts = np.array([(data.train.labels[members] == k).sum() for k in range(10)])
    np.testing.assert_allclose(client_eval.mix[c], counts / counts.sum())
  for batch, groups in zip(data.eval_batches(), client_eval.groups):
    assert np.array_equal(groups, np.where(batch['mask'] > 0, batch['targets'], -1))
  assert ImageData(dataset='digits').client_eval() is None  # One client: centralized.


def direct_client_metrics(losses, correct, mask, groups, mix):
  """Per-client loss and accuracy straight from the definition: group means mixed by `mix`;
  None for a client with a mixed-in group that has no targets."""
  out = []
  for row in mix:
    parts = []
    for g in np.flatnonzero(row > 0):
      sel = (groups == g) & (mask > 0)
      if not sel.any():
        parts = None
        break
      parts.append((row[g], losses[sel].mean(), correct[sel].mean()))
    out.append(None if parts is None else (sum(w * l for w, l, _ in parts),
                                           sum(w * a for w, _, a in parts)))
  return out


@pytest.mark.parametrize('mix', [np.eye(5), np.array(
    [[0.5, 0.5, 0, 0, 0], [0.1, 0.2, 0.3, 0.4, 0], [0, 0, 0, 0, 1.0], [0.25] * 4 + [0]])])
def test_client_metrics_equal_a_direct_computation(mix):
  rng = np.random.default_rng(0)
  losses = rng.exponential(size=(4, 3, 7)).astype(np.float32)
  correct = (rng.random((4, 3, 7)) < 0.4).astype(np.float32)
  mask = (rng.random((4, 3, 7)) < 0.8).astype(np.float32)
  groups = rng.integers(-1, 4, size=(4, 3, 7)).astype(np.int32)  # Group 4 gets no targets.
  sums = sum(evaluation.group_sums(jnp.asarray(losses[i]), jnp.asarray(correct[i]),
                                   jnp.asarray(mask[i]), jnp.asarray(groups[i]), 5)
             for i in range(4))
  names = tuple(f'c{i}' for i in range(len(mix)))
  summary, table = evaluation.client_metrics(np.asarray(sums), ClientEval(names, [], mix))
  want = direct_client_metrics(losses, correct, mask, groups, mix)
  assert set(table) == {n for n, w in zip(names, want) if w is not None}
  for name, w in zip(names, want):
    if w is not None:
      assert table[name]['loss'] == pytest.approx(w[0], rel=1e-5)
      assert table[name]['accuracy'] == pytest.approx(w[1], rel=1e-5)
  evaluated = [w for w in want if w is not None]
  assert summary['clients_evaluated'] == len(evaluated)
  assert summary['client_loss_mean'] == pytest.approx(np.mean([w[0] for w in evaluated]), 1e-5)
  assert summary['client_loss_p90'] == pytest.approx(
      np.percentile([w[0] for w in evaluated], 90), rel=1e-5)
  assert summary['client_accuracy_p10'] == pytest.approx(
      np.percentile([w[1] for w in evaluated], 10), rel=1e-5, abs=1e-7)


def test_eval_clients_rows_after_the_restored_step_are_dropped_on_resume(tmp_path):
  writer = RunWriter(tmp_path, 0, 4)
  for step in (2, 4):
    writer.write(step, {'loss': 1.0}, {'loss': 2.0}, {'a': {'loss': float(step)}})
  writer.close()
  writer = RunWriter(tmp_path, 2, 4)  # Resumed from the step-2 checkpoint.
  writer.write(4, {'loss': 1.0}, {'loss': 2.0}, {'a': {'loss': 40.0}})
  writer.close()
  rows = [json.loads(line) for line in (tmp_path / 'eval_clients.jsonl').read_text().splitlines()]
  assert rows == [{'step': 2, 'clients': {'a': {'loss': 2.0}}},
                  {'step': 4, 'clients': {'a': {'loss': 40.0}}}]


def test_tiled_lm_eval_scores_every_test_byte_once_and_reaches_every_client(prepared):
  data = LmData(dataset='shakespeare', partition='natural', seq_len=50, eval_batch_size=8,
                num_eval_batches=None)
  batches, stream = data.eval_batches(), data.eval_tokens
  targets = np.concatenate([b['targets'][b['mask'] > 0] for b in batches])
  assert np.array_equal(targets, stream[1:])  # In order, each once, nothing else.
  assert all(b['inputs'].shape == (8, 50) for b in batches)
  client_eval = data.client_eval()
  grouped = np.concatenate([g[b['mask'] > 0] for g, b in zip(client_eval.groups, batches)])
  texts, roles = lm.read_documents('shakespeare', 'test')
  with_text = {r for r in roles.tolist() if r in data.train_streams.names}
  assert {client_eval.names[g] for g in np.unique(grouped[grouped >= 0])} == with_text
  with pytest.raises(UserError, match='num_eval_batches must be a positive int or None'):
    LmData(num_eval_batches=0)
