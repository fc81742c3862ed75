"""SFT documents longer than a row: pieces that hold only prompt tokens are left out of the
plan (no row trains on nothing, so no logged loss is a mean over zero targets), the completion
is still scored exactly once, and the packing line says how many pieces were left out."""

import json

import numpy as np
import pytest

from paxlike.data import packing, token_store
from paxlike.data.text_data import TextData
from paxlike.data.text_files import Fields

PAD = -1


def test_prompt_only_pieces_are_left_out_and_every_row_has_a_target():
  rng = np.random.default_rng(0)
  prompt = rng.integers(30, 60, size=50)  # Most prompts fill two or more rows of 16.
  lengths = prompt + rng.integers(1, 4, size=50)
  capacity, docs = 16, np.arange(50)
  start = np.concatenate([[0], np.cumsum(lengths)])
  has_target = lambda doc, offset, length: (length >= 2) & (offset + length - 1 >= prompt[doc])
  everything = packing.make_plan(lengths, docs, capacity)
  plan = packing.make_plan(lengths, docs, capacity, has_target)
  pack = lambda p: packing.pack_rows(p, np.arange(p.num_rows), start[:-1],
                                     lambda i: i.astype(np.int32), capacity, PAD, prompt)
  before, after = pack(everything), pack(plan)
  assert (before['mask'].sum(axis=1) == 0).any()  # Without the filter: rows of no target.
  assert (after['mask'].sum(axis=1) > 0).all()
  assert after['mask'].sum() == before['mask'].sum() == (lengths - prompt).sum()
  assert plan.num_rows < everything.num_rows


@pytest.fixture
def long_prompts(tmp_path, monkeypatch):
  monkeypatch.setenv(token_store.TOKEN_DIR_ENV, str(tmp_path / 'tokens'))
  path = tmp_path / 'sft.jsonl'
  path.write_text(''.join(json.dumps({'prompt': f'question {i}: ' + 'why ' * (10 + i % 20),
                                      'completion': f' {i}'}) + '\n' for i in range(120)))
  return path


def test_text_data_reports_the_left_out_pieces_and_trains_on_targets_only(long_prompts):
  data = TextData(files=str(long_prompts), fields=Fields(prompt_field='prompt'), seq_len=32, batch_size=8,
                  eval_fraction=0.1)
  meta = data.packed.meta
  assert meta['targetless_pieces'] > 0 and meta['documents_with_targetless_pieces'] > 0
  assert meta['targetless_documents'] == 0  # Each completion (and its EOS) is kept.
  line = data.config_lines()
  assert (f"# {meta['targetless_pieces']:,} pieces of {meta['documents_with_targetless_pieces']:,}"
          ' training documents hold no target') in line
  for step in range(6):
    batches, _ = data.round_batches(0, step)
    assert (batches['mask'].sum(axis=-1) > 0).all()
