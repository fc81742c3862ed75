"""Packing documents into rows, checked against independent computations on an identity store
(token value = its index in the store), so every target names the token it came from."""

import numpy as np
import pytest

from paxlike.data import packing

PAD = -1


def naive_best_fit_decreasing(lengths, capacity):
  """One item at a time: the row with the least room that fits, ties to the row that reached
  that room first; else a new row."""
  room, since, row, clock = [], [], np.empty(len(lengths), np.int64), 0
  for i in np.argsort(-np.asarray(lengths), kind='stable'):
    fits = [r for r in range(len(room)) if room[r] >= lengths[i]]
    if fits:
      best = min(fits, key=lambda r: (room[r], since[r]))
    else:
      best = len(room)
      room.append(capacity)
      since.append(0)
    room[best] -= lengths[i]
    since[best], clock = clock, clock + 1
    row[i] = best
  return row


def identity_batch(lengths, capacity, prompt_len=None, rows=None):
  lengths = np.asarray(lengths, np.int64)
  plan = packing.make_plan(lengths, np.arange(len(lengths)), capacity)
  start = np.concatenate([[0], np.cumsum(lengths)])
  rows = np.arange(plan.num_rows) if rows is None else rows
  batch = packing.pack_rows(plan, rows, start[:-1], lambda i: i.astype(np.int32), capacity,
                            PAD, prompt_len)
  return plan, start, batch


def doc_of(start, tokens):
  return np.searchsorted(start, tokens, side='right') - 1


@pytest.mark.parametrize('seed', range(4))
def test_best_fit_decreasing_equals_one_item_at_a_time(seed):
  rng = np.random.default_rng(seed)
  capacity = int(rng.integers(8, 40))
  lengths = rng.integers(1, capacity + 1, size=int(rng.integers(1, 200)))
  if seed % 2:  # Many ties.
    lengths = rng.choice([1, 2, 3, capacity // 2, capacity], size=len(lengths))
  assert np.array_equal(packing.best_fit_decreasing(lengths, capacity),
                        naive_best_fit_decreasing(lengths, capacity))


def test_long_documents_split_into_pieces_sharing_one_token():
  doc, offset, length = packing.split_documents(np.array([3, 5, 6, 13, 1]), 5)
  assert doc.tolist() == [0, 1, 2, 2, 3, 3, 3, 4]
  assert offset.tolist() == [0, 0, 0, 4, 0, 4, 8, 0]
  assert length.tolist() == [3, 5, 5, 2, 5, 5, 5, 1]


@pytest.mark.parametrize('seed', range(3))
def test_every_document_token_but_the_first_is_a_target_exactly_once(seed):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, 70, size=300)
  lengths[:3] = [200, 65, 64]  # Longer than a row, and exactly a row.
  plan, start, batch = identity_batch(lengths, 33)
  assert (plan.length <= 33).all() and (np.bincount(plan.doc, minlength=300) > 0).all()
  trained = batch['targets'][batch['mask'] == 1]
  expected = np.setdiff1d(np.arange(start[-1]), start[:-1])
  assert np.array_equal(np.sort(trained), expected)  # Sorted equal: each once, none missing.


def test_segments_positions_and_masks_follow_document_boundaries():
  lengths = np.random.default_rng(7).integers(1, 30, size=120)
  _, start, batch = identity_batch(lengths, 17)
  inputs, targets, seg, pos = (batch[k] for k in ('inputs', 'targets', 'segment_ids',
                                                  'positions'))
  real = inputs != PAD
  assert (seg[~real] == 0).all() and (seg[real] > 0).all()
  docs = doc_of(start, inputs)
  for r in range(len(inputs)):
    n = real[r].sum()
    assert real[r, :n].all()  # Padding only at the end of a row.
    # A new segment wherever the document changes; ids count 1, 2, ... along the row.
    new = np.r_[True, docs[r, 1:n] != docs[r, :n - 1]]
    assert np.array_equal(seg[r, :n], np.cumsum(new))
    first = np.maximum.accumulate(np.where(new, np.arange(n), 0))
    assert np.array_equal(pos[r, :n], np.arange(n) - first)  # Restart at 0 per document.
  same_doc = (targets == inputs + 1) & (doc_of(start, targets) == docs) & real
  assert np.array_equal(batch['mask'], same_doc.astype(np.float32))
  assert batch['mask'][targets == PAD].sum() == 0
  assert {k: v.dtype for k, v in batch.items()} == {
      'inputs': np.int32, 'targets': np.int32, 'segment_ids': np.int32,
      'positions': np.int32, 'mask': np.float32}


def test_sft_mask_covers_completion_and_eos_only():
  rng = np.random.default_rng(3)
  prompt = rng.integers(1, 12, size=80)
  lengths = prompt + rng.integers(1, 12, size=80)  # Completion + EOS >= 1 token.
  lengths[0], prompt[0] = 40, 30  # Split across rows, prompt spanning a piece boundary.
  _, start, batch = identity_batch(lengths, 16, prompt_len=prompt)
  inputs, targets = batch['inputs'], batch['targets']
  d = doc_of(start, targets)
  in_completion = targets - start[d] >= prompt[d]
  expected = (targets == inputs + 1) & (doc_of(start, inputs) == d) & (inputs != PAD)
  assert np.array_equal(batch['mask'], (expected & in_completion).astype(np.float32))
  completion_tokens = (lengths - prompt).sum()
  assert batch['mask'].sum() == completion_tokens  # Each completion token (and EOS) once.


def test_rows_of_any_shape_and_empty_rows():
  lengths = np.arange(1, 40)
  plan, _, whole = identity_batch(lengths, 20)
  picks = np.array([[3, -1], [0, plan.num_rows - 1]])
  _, _, part = identity_batch(lengths, 20, rows=picks)
  for key, value in part.items():
    assert value.shape == (2, 2, 19)
    assert np.array_equal(value[0, 0], whole[key][3])
    assert np.array_equal(value[1], whole[key][[0, plan.num_rows - 1]])
  assert part['mask'][0, 1].sum() == 0 and (part['inputs'][0, 1] == PAD).all()


def test_efficiency_is_the_non_pad_fraction_of_targets():
  lengths = np.random.default_rng(0).integers(1, 50, size=500)
  plan, _, batch = identity_batch(lengths, 65)
  assert packing.efficiency(plan, 65) == pytest.approx((batch['targets'] != PAD).mean())
  assert packing.efficiency(plan, 65) > 0.99  # Best-fit decreasing leaves little room.


def test_target_docs_names_the_document_of_each_shared_segment_target():
  lengths = np.random.default_rng(2).integers(1, 30, size=50)
  plan, start, batch = identity_batch(lengths, 24)
  got = packing.target_docs(plan, np.arange(plan.num_rows), 24)
  expected = np.where(batch['mask'] == 1, doc_of(start, batch['targets']), -1)
  assert np.array_equal(got, expected)


def test_concat_plans_keeps_each_plans_rows():
  a = packing.make_plan(np.array([3, 4, 5]), np.array([0, 2]), 8)
  b = packing.make_plan(np.array([3, 4, 5]), np.array([1]), 8)
  joined, starts = packing.concat_plans([a, b])
  assert starts.tolist() == [0, a.num_rows, a.num_rows + b.num_rows]
  for plan, base in ((a, 0), (b, a.num_rows)):
    for r in range(plan.num_rows):
      got = slice(joined.row_start[base + r], joined.row_start[base + r + 1])
      mine = slice(plan.row_start[r], plan.row_start[r + 1])
      assert np.array_equal(joined.doc[got], plan.doc[mine])
      assert np.array_equal(joined.length[got], plan.length[mine])
