"""The one cohort rule (`DataSource.cohort`) and the one client count (`DataSource.client_sizes`),
checked against every source: each source's rounds are drawn for the cohort the rule gives (and
follow the rule when it changes), weighed by its clients' sizes; a cohort among live clients
never holds a dead one; the Flower apps and the privacy accountant ask the source the same."""

import dataclasses
import json
import types
from typing import Any, ClassVar

import numpy as np
import pytest

from paxlike.data import ImageData, LmData, sources, token_store
from paxlike.data.preference_data import PreferenceData
from paxlike.data.prompt_data import PromptData
from paxlike.data.text_data import TextData
from paxlike.deploy.flower import records
from paxlike.errors import UserError
from paxlike.trainer import privacy

SEED, STEPS = 5, range(1, 7)


def _files(directory, name: str, rows: dict[str, list[dict]]) -> list[str]:
  """One JSONL file per key of `rows` under directory/name."""
  folder = directory / name
  folder.mkdir()
  paths = []
  for stem, lines in rows.items():
    path = folder / f'{stem}.jsonl'
    path.write_text(''.join(json.dumps(line) + '\n' for line in lines))
    paths.append(str(path))
  return paths


def _text(directory, **fields) -> TextData:
  """Six files of one letter each (a client per file, of 10 to 60 rows)."""
  rows = {x: [{'text': x * (1 + i % 25)} for i in range(10 * (n + 1))]
          for n, x in enumerate('abcdef')}
  return TextData(files=_files(directory, 'text', rows), seq_len=16, batch_size=2,
                  local_steps=2, eval_fraction=0.2, **fields)


def _pairs(directory, **fields) -> PreferenceData:
  """Four files of preference pairs (a client per file, of 20 to 50 pairs)."""
  rows = {x: [{'prompt': f'{x}{i}? ', 'chosen': f'yes {i}', 'rejected': f'no {i}!'}
              for i in range(10 * (n + 2))] for n, x in enumerate('pqrs')}
  return PreferenceData(files=_files(directory, 'pairs', rows), seq_len=24, batch_size=2,
                        eval_batch_size=2, eval_fraction=0.2, **fields)


def _prompts(directory) -> PromptData:
  rows = {'rows': [{'prompt': f'{i}+1=', 'answer': str(i + 1)} for i in range(30)]}
  return PromptData(files=_files(directory, 'prompts', rows)[0], seq_len=8, batch_size=2,
                    eval_fraction=0.2, eval_batch_size=2)


def _digits(**fields) -> ImageData:
  return ImageData(dataset='digits', partition='dirichlet', num_clients=6, local_steps=2,
                   batch_size=3, **fields)


SOURCES = {
    'images uniform': lambda d: _digits(clients_per_round=3),
    'images weighted': lambda d: _digits(clients_per_round=3, sampling='weighted'),
    'images poisson': lambda d: _digits(clients_per_round=2, sampling='poisson'),
    'images fixed': lambda d: _digits(clients_per_round=6, sampling='fixed'),
    'lm natural': lambda d: LmData(dataset='shakespeare', partition='natural',
                                   clients_per_round=4, seq_len=16, batch_size=2,
                                   min_client_chars=500),
    'lm domains poisson': lambda d: LmData(dataset='stdlib', partition='domains',
                                           num_clients=5, clients_per_round=2, seq_len=16,
                                           batch_size=2, sampling='poisson'),
    'lm pooled': lambda d: LmData(dataset='shakespeare', clients_per_round=3, seq_len=16,
                                  batch_size=2),
    'text uniform': lambda d: _text(d, partition='file', clients_per_round=3),
    'text weighted': lambda d: _text(d, partition='file', clients_per_round=3,
                                     sampling='weighted'),
    'text poisson': lambda d: _text(d, partition='file', clients_per_round=2,
                                    sampling='poisson'),
    'text fixed': lambda d: _text(d, partition='file', clients_per_round=6, sampling='fixed'),
    'text pooled': lambda d: _text(d, clients_per_round=2),
    'pairs uniform': lambda d: _pairs(d, partition='file', clients_per_round=2),
    'pairs pooled': lambda d: _pairs(d, clients_per_round=2),
    'prompts': _prompts,
}


@pytest.fixture(params=list(SOURCES))
def data(request, prepared, tmp_path, monkeypatch) -> sources.DataSource:
  """Each source, its data read (text into a token store of its own)."""
  monkeypatch.setenv(token_store.TOKEN_DIR_ENV, str(tmp_path / 'tokens'))
  source = SOURCES[request.param](tmp_path)
  source.prepare()
  return source


def _rule(data: sources.DataSource, step: int) -> np.ndarray:
  """The rule, written out: pooled data's slots all read client 0, clients are sampled."""
  if data.partition == 'pooled':
    return np.zeros(data.clients_per_round, np.int64)
  return sources.sample_cohort(SEED, step, data.client_sizes, data.clients_per_round,
                               data.sampling)


def _same(got: tuple[dict, np.ndarray], expected: tuple[dict, np.ndarray]) -> None:
  (batch, weights), (want, want_weights) = got, expected
  np.testing.assert_array_equal(weights, want_weights)
  assert sorted(batch) == sorted(want)
  for key in want:
    np.testing.assert_array_equal(batch[key], want[key], err_msg=key)


def test_each_source_draws_its_rounds_by_the_one_rule(data):
  sizes = data.client_sizes
  assert sizes.ndim == 1 and len(sizes) >= 1 and (sizes > 0).all()
  for step in STEPS:
    cohort = data.cohort(SEED, step)
    np.testing.assert_array_equal(cohort, _rule(data, step))
    assert cohort.dtype == np.int64 and cohort.shape == (data.num_slots,)
    drawn = data.round_batches(SEED, step)
    _same(data.round_batches(SEED, step, cohort=cohort), drawn)
    if data.batch_kind != 'prompts':  # GRPO's one model weighs its one prompt batch 1.
      np.testing.assert_array_equal(drawn[1],
                                    sources.cohort_weights(sizes, cohort, data.sampling))


def test_each_source_follows_the_rule_when_the_rule_changes(data, monkeypatch):
  """No source keeps a rule of its own: a different DataSource.cohort moves every source's
  rounds to the cohort it gives."""
  other = np.roll(data.cohort(SEED, 3), 1)
  expected = data.round_batches(SEED, 3, cohort=other)
  monkeypatch.setattr(sources.DataSource, 'cohort', lambda self, seed, step, live=None,
                      sizes=None: other)
  _same(data.round_batches(SEED, 3), expected)


def test_clients_are_counted_one_way_by_the_source_flower_and_privacy(data):
  count = len(data.client_sizes)
  assert count == len(getattr(data, 'client_names', data.client_sizes))
  assert records.population(data) == count
  np.testing.assert_array_equal(records.client_sizes(data), data.client_sizes)
  task = types.SimpleNamespace(data=data)
  if data.partition == 'pooled':
    assert count == 1
    with pytest.raises(UserError, match='differential privacy needs clients'):
      privacy.population(task)
  else:
    assert privacy.population(task) == count


def test_a_cohort_among_live_clients_leaves_the_dead_out(data):
  n = len(data.client_sizes)
  everyone, dead = list(range(n)), {0, n - 1}
  live = [c for c in everyone if c not in dead]
  for step in STEPS:
    whole = data.cohort(SEED, step)
    np.testing.assert_array_equal(data.cohort(SEED, step, everyone), whole)
    among = data.cohort(SEED, step, live)
    assert among.shape == whole.shape and not set(among.tolist()) & dead
    if data.sampling in ('poisson', 'fixed'):  # The live joiners keep their draw.
      kept = [c for c in whole.tolist() if c not in dead and c != sources.PADDED]
      assert [c for c in among.tolist() if c != sources.PADDED] == kept
    np.testing.assert_array_equal(
        records.cohort(data, SEED, step, records.client_sizes(data), live), among)
    _, weights = data.round_batches(SEED, step, cohort=among)  # A lost client weighs nothing.
    assert data.batch_kind == 'prompts' or (weights[among == sources.PADDED] == 0).all()
  if data.partition == 'pooled':  # Its one client lost, every slot is.
    assert data.cohort(SEED, 1, live=[]).tolist() == [sources.PADDED] * data.clients_per_round


@dataclasses.dataclass
class Counted(sources.DataSource):
  """A source that says only its clients' sizes: cohorts, slots and the apps' questions come
  from the protocol."""

  sizes: tuple[int, ...] = (4, 9, 2, 7, 5)
  clients_per_round: int = 2
  sampling: str = 'uniform'
  partition: str = 'iid'
  local_steps: int = 1
  batch_size: int = 1
  eval_batch_size: int = 1
  item: ClassVar[sources.Item] = 'examples'

  @property
  def client_sizes(self) -> np.ndarray:
    return np.asarray(self.sizes, np.int64)

  def prepare(self) -> None:
    """Nothing to read."""

  def row_spec(self) -> dict[str, sources.Spec]:
    return {'mask': sources.Spec((), np.dtype(np.float32))}

  def round_batches(self, seed: int, step: int, clients: slice = slice(None),
                    rows: slice = slice(None), cohort: np.ndarray | None = None
                    ) -> tuple[sources.Batch, np.ndarray]:
    cohort = self.round_cohort(seed, step, cohort)
    mask = (cohort != sources.PADDED).astype(np.float32)[:, None, None]
    return ({'mask': mask[clients, :, rows]},
            sources.cohort_weights(self.client_sizes, cohort, self.sampling))

  def eval_batches(self, rows: slice = slice(None)) -> list[sources.Batch]:
    return [{'mask': np.ones(1, np.float32)[rows]}]

  def describe(self) -> dict[str, Any]:
    return sources.size_stats(self.client_sizes)


def test_a_new_source_needs_only_its_client_sizes():
  for sampling, k in (('uniform', 2), ('weighted', 2), ('poisson', 2), ('fixed', 5)):
    data = Counted(sampling=sampling, clients_per_round=k)
    assert data.num_slots == (sources.poisson_slots(5, 2) if sampling == 'poisson' else k)
    assert records.population(data) == 5
    for step in STEPS:
      cohort = data.cohort(SEED, step)
      np.testing.assert_array_equal(cohort, sources.sample_cohort(SEED, step, data.client_sizes,
                                                                  k, sampling))
      np.testing.assert_array_equal(
          records.cohort(data, SEED, step, records.client_sizes(data), [1, 2, 3]),
          data.cohort(SEED, step, [1, 2, 3]))
  assert privacy.population(types.SimpleNamespace(data=Counted())) == 5
  with pytest.raises(UserError, match='at most once'):
    Counted().round_batches(0, 1, cohort=np.array([3, 3]))
  with pytest.raises(TypeError, match='client_sizes'):
    type('Uncounted', (sources.DataSource,), {
        name: getattr(Counted, name) for name in
        ('prepare', 'row_spec', 'round_batches', 'eval_batches', 'describe')})()


def test_a_deployment_server_draws_by_the_sizes_its_nodes_report():
  """`sizes` given: the rule draws by them, not by data the server need not hold."""
  data = Counted(sampling='weighted')
  reported = np.array([1, 1, 1, 1, 100])
  for step in STEPS:
    np.testing.assert_array_equal(
        data.cohort(SEED, step, sizes=reported),
        sources.sample_cohort(SEED, step, reported, 2, 'weighted'))
