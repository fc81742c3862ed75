"""Every source's `batch_spec()` (what the trainer compiles for, without building a batch) is
exactly what its batches hold: keys, shapes and dtypes of a round, its weights and an eval
batch, with Poisson cohorts and stragglers (STEP_MASK) too."""

import json

import pytest

from paxlike.data import ImageData, LmData, TextData, sources, token_store
from paxlike.data import arithmetic_synth
from paxlike.data.preference_data import PreferenceData
from paxlike.data.prompt_data import PromptData
from paxlike.data.text_files import Fields


def assert_spec_matches(data: sources.DataSource) -> None:
  data.prepare()
  spec = data.batch_spec()
  batches, weights = data.round_batches(5, 3)
  assert sources.spec_of(batches) == spec.round
  assert sources.spec_of({'w': weights}) == {'w': spec.weights}
  for batch in data.eval_batches()[:2]:
    assert sources.spec_of(batch) == spec.eval


@pytest.mark.parametrize('kwargs', [
    {},
    {'partition': 'natural', 'sampling': 'poisson', 'clients_per_round': 3, 'local_steps': 2,
     'straggler_fraction': 0.5},
])
def test_byte_lm(prepared, kwargs):
  assert_spec_matches(LmData(dataset='shakespeare', seq_len=16, batch_size=2,
                             eval_batch_size=3, **kwargs))


@pytest.mark.parametrize('kwargs', [
    {}, {'num_clients': 6, 'partition': 'dirichlet', 'sampling': 'poisson', 'clients_per_round': 2},
])
def test_images(prepared, kwargs):
  assert_spec_matches(ImageData(dataset='digits', batch_size=4, eval_batch_size=5,
                                num_eval_batches=2, **kwargs))


@pytest.fixture
def token_dir(tmp_path, monkeypatch):
  monkeypatch.setenv(token_store.TOKEN_DIR_ENV, str(tmp_path / 'tokens'))


def test_text_with_clients(tmp_path, token_dir):
  for c in range(4):
    (tmp_path / f'c{c}.txt').write_text('\n'.join(f'client {c} line {i} ' * 3
                                                  for i in range(30)))
  assert_spec_matches(TextData(files=str(tmp_path / '*.txt'), fields=Fields(txt_document='line'), seq_len=24,
                               batch_size=3, eval_batch_size=2, eval_fraction=0.2,
                               partition='file', sampling='poisson', clients_per_round=2,
                               local_steps=2))


def test_preference_pairs(tmp_path, token_dir):
  rows = [{'prompt': f'Q{i}? ', 'chosen': f'yes {i}', 'rejected': f'no {i}!'} for i in range(30)]
  path = tmp_path / 'pairs.jsonl'
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  data = PreferenceData(files=str(path), seq_len=16, batch_size=2, eval_batch_size=3,
                        eval_fraction=0.3)
  assert_spec_matches(data)
  assert data.batch_spec().round['inputs'].shape == (1, 1, 4, 16)  # Two rows a pair.


def test_grpo_prompts(tmp_path):
  rows = arithmetic_synth.addition_rows(30, seed=2)
  path = tmp_path / 'prompts.jsonl'
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  assert_spec_matches(PromptData(files=str(path), seq_len=8, batch_size=3, eval_fraction=0.2,
                                 eval_batch_size=2))
