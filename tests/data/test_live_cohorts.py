"""Cohorts drawn among a deployment's live clients (sources.sample_cohort(..., live)) and batches
drawn for an explicit cohort (round_batches(..., cohort=)): with every client live the cohort
is the simulation's, and the batches for the simulation's cohort are the simulation's; a lost
client is never drawn, and the batches follow the cohort they are given."""

import json
import math

import numpy as np
import pytest

from paxlike.data import ImageData
from paxlike.data import sources
from paxlike.data import token_store
from paxlike.data.text_data import TextData
from paxlike.errors import UserError

SIZES = np.array([5, 40, 12, 7, 30, 9, 21, 16])


@pytest.mark.parametrize('sampling', ['uniform', 'weighted', 'poisson', 'fixed'])
def test_every_client_live_gives_the_simulations_cohort(sampling):
  k = len(SIZES) if sampling == 'fixed' else 3
  for step in range(60):
    expected = sources.sample_cohort(4, step, SIZES, k, sampling)
    got = sources.sample_cohort(4, step, SIZES, k, sampling, live=range(len(SIZES)))
    np.testing.assert_array_equal(got, expected)


def test_uniform_draws_k_distinct_live_clients_each_equally_often():
  live, k, steps = [0, 2, 3, 5, 7], 3, 3000
  cohorts = np.stack([sources.sample_cohort(1, s, SIZES, k, 'uniform', live=live)
                      for s in range(steps)])
  assert np.isin(cohorts, live).all()
  assert all(len(set(row)) == k for row in cohorts.tolist())
  share = np.bincount(cohorts.ravel(), minlength=len(SIZES))[live] / steps
  q = k / len(live)  # Each live client is in a cohort with probability k / live.
  assert abs(share - q).max() < 5 * math.sqrt(q * (1 - q) / steps)
  again = sources.sample_cohort(1, 17, SIZES, k, 'uniform', live=list(reversed(live)))
  np.testing.assert_array_equal(again, cohorts[17])  # A pure function of the live set.


def test_weighted_draws_in_proportion_to_the_live_clients_sizes():
  live, steps = [1, 2, 6], 4000
  firsts = np.array([sources.sample_cohort(2, s, SIZES, 1, 'weighted', live=live)[0]
                     for s in range(steps)])
  p = SIZES[live] / SIZES[live].sum()
  share = np.array([(firsts == c).mean() for c in live])
  assert abs(share - p).max() < 5 * math.sqrt(0.25 / steps)


def test_poisson_keeps_the_live_joiners_and_fixed_pads_a_lost_slot():
  live = [0, 1, 4, 5, 6]
  for step in range(40):
    whole = sources.sample_cohort(3, step, SIZES, 3, 'poisson')
    got = sources.sample_cohort(3, step, SIZES, 3, 'poisson', live=live)
    joined = [c for c in whole.tolist() if c != sources.PADDED and c in live]
    assert got.tolist() == joined + [sources.PADDED] * (len(whole) - len(joined))
  fixed = sources.sample_cohort(0, 5, SIZES[:4], 4, 'fixed', live=[0, 2, 3])
  assert fixed.tolist() == [0, sources.PADDED, 2, 3]


def test_fewer_live_clients_than_slots_fill_what_they_can_then_pad():
  got = sources.sample_cohort(0, 2, SIZES, 4, 'uniform', live=[3, 6])
  assert sorted(got[:2].tolist()) == [3, 6] and got[2:].tolist() == [sources.PADDED] * 2
  assert sources.sample_cohort(0, 2, SIZES, 2, 'uniform', live=[]).tolist() == [-1, -1]
  with pytest.raises(UserError, match='live clients'):
    sources.sample_cohort(0, 2, SIZES, 2, 'uniform', live=[0, 8])


def _digits(**kwargs) -> ImageData:
  return ImageData(dataset='digits', partition='dirichlet', alpha=0.5, num_clients=6,
                   clients_per_round=3, local_steps=2, batch_size=4, **kwargs)


@pytest.mark.parametrize('sampling', ['uniform', 'poisson'])
def test_batches_for_the_simulations_cohort_are_the_simulations(prepared, sampling):
  data = _digits(sampling=sampling)
  for step in (0, 3):
    cohort = sources.sample_cohort(7, step, data.client_sizes, 3, sampling)
    batch, weights = data.round_batches(7, step)
    given, given_weights = data.round_batches(7, step, cohort=cohort)
    np.testing.assert_array_equal(given_weights, weights)
    assert sorted(given) == sorted(batch)
    for name in batch:
      np.testing.assert_array_equal(given[name], batch[name], err_msg=name)
    part, _ = data.round_batches(7, step, clients=slice(1, 2), cohort=cohort)
    np.testing.assert_array_equal(part['inputs'], batch['inputs'][1:2])  # A block = a slice.


def test_batches_follow_the_cohort_given_and_a_bad_one_is_refused_in_one_line(prepared):
  data = _digits()
  cohort = np.array([5, 0, 3])
  batch, weights = data.round_batches(7, 2, cohort=cohort)
  np.testing.assert_array_equal(weights, data.client_sizes[cohort].astype(np.float32))
  for slot, client in enumerate(cohort):  # Each slot's examples are its client's own.
    labels = set(data.train.labels[data.clients[client]].tolist())
    assert set(batch['targets'][slot].ravel().tolist()) <= labels
  padded, padded_weights = data.round_batches(7, 2, cohort=np.array([5, -1, 3]))
  assert padded_weights[1] == 0 and not padded['mask'][1].any()
  for bad, message in (([5, 0], 'must be 3 client ids'), ([5, 0, 6], 'must be 3 client ids'),
                       ([5, 5, 1], 'at most once')):
    with pytest.raises(UserError, match=message) as error:
      data.round_batches(7, 2, cohort=np.array(bad))
    assert '\n' not in str(error.value)


def test_text_batches_follow_the_cohort_given(tmp_path, monkeypatch):
  monkeypatch.setenv(token_store.TOKEN_DIR_ENV, str(tmp_path / 'tokens'))
  letters = 'abcdef'  # One client per file, each of its own letter.
  files = []
  for x in letters:
    path = tmp_path / f'{x}.jsonl'
    path.write_text(''.join(json.dumps({'text': x * (1 + i % 30)}) + '\n' for i in range(40)))
    files.append(str(path))
  data = TextData(files=files, seq_len=16, batch_size=2, partition='file', clients_per_round=3,
                  local_steps=2, eval_fraction=0.2)
  sampled = sources.sample_cohort(4, 3, data.packed.client_tokens, 3, 'uniform')
  batch, weights = data.round_batches(4, 3)
  given, given_weights = data.round_batches(4, 3, cohort=sampled)
  np.testing.assert_array_equal(given_weights, weights)
  for key in batch:
    np.testing.assert_array_equal(given[key], batch[key], err_msg=key)
  cohort = np.array([5, 1, 2])
  other, other_weights = data.round_batches(4, 3, cohort=cohort)
  np.testing.assert_array_equal(other_weights, data.packed.client_tokens[cohort])
  for slot, client in enumerate(cohort):
    trained = set(other['targets'][slot][other['mask'][slot] == 1].tolist())
    assert trained and trained <= {ord(letters[client]), ord('\n')}
