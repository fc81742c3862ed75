"""PreferenceData: JSONL pairs (text and chat) as padded pair batches whose two rows of a pair
stay adjacent, with exactly the completions' targets scored; what does not fit is dropped or
truncated and counted; bad rows are one-line errors; a batch is a function of (seed, step)."""

import json

import numpy as np
import pytest

from paxlike.data import token_store
from paxlike.data.preference_data import PreferenceData
from paxlike.errors import UserError
from tests.tokenizers.chat_fixtures import write_family


@pytest.fixture(autouse=True)
def token_dir(tmp_path, monkeypatch):
  monkeypatch.setenv(token_store.TOKEN_DIR_ENV, str(tmp_path / 'tokens'))


def write_rows(path, rows) -> str:
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  return str(path)


def text_rows(n: int = 40) -> list[dict]:
  return [{'prompt': f'Q{i}: colour? ', 'chosen': f'blue {i}', 'rejected': f'red {i}!'}
          for i in range(n)]


def text_data(tmp_path, rows=None, **overrides) -> PreferenceData:
  files = write_rows(tmp_path / 'pairs.jsonl', text_rows() if rows is None else rows)
  settings = dict(files=files, tokenizer='bytes', seq_len=24, batch_size=4, eval_batch_size=4,
                  eval_fraction=0.25)
  return PreferenceData(**{**settings, **overrides})


def decode(ids) -> str:
  return bytes(int(i) for i in ids).decode()


def scored_text(batch, row: int) -> str:
  return decode(batch['targets'][row][batch['mask'][row] > 0])


def test_a_pair_is_two_adjacent_rows_sharing_the_prompt_scoring_only_the_completions(tmp_path):
  data = text_data(tmp_path)
  rows = {row['prompt']: row for row in text_rows()}
  batch, weights = data.round_batches(0, 3)
  assert batch['inputs'].shape == (1, 1, 8, 24)
  assert weights.tolist() == [data.plan['meta']['train_pairs']]  # FedAvg's weight: its pairs.
  flat = {k: v.reshape(8, 24) for k, v in batch.items()}
  for pair in range(4):
    chosen, rejected = 2 * pair, 2 * pair + 1
    text = decode(flat['inputs'][chosen][flat['segment_ids'][chosen] > 0])
    row = rows[text[:text.index('? ') + 2]]
    n = len(row['prompt'])
    assert decode(flat['inputs'][rejected][:n]) == row['prompt']
    assert scored_text(flat, chosen) == row['chosen'] + '\n'  # EOS ('\n' for bytes) scored.
    assert scored_text(flat, rejected) == row['rejected'] + '\n'
    assert flat['mask'][chosen][:n - 1].sum() == 0  # The prompt's targets are not scored.


def test_batches_are_a_function_of_seed_and_step_and_rows_cut_the_same_batch(tmp_path):
  data = text_data(tmp_path)
  whole, _ = data.round_batches(0, 5)
  again, _ = text_data(tmp_path).round_batches(0, 5)
  for key in whole:
    np.testing.assert_array_equal(whole[key], again[key])
    for rows in (slice(0, 4), slice(1, 3), slice(3, 8), slice(5, 6)):
      part, _ = data.round_batches(0, 5, rows=rows)
      np.testing.assert_array_equal(part[key], whole[key][:, :, rows])
  other, _ = data.round_batches(0, 6)
  assert not np.array_equal(other['inputs'], whole['inputs'])


def test_every_training_pair_comes_once_per_epoch_and_held_out_pairs_never(tmp_path):
  data = text_data(tmp_path, batch_size=2)
  meta = data.plan['meta']
  assert meta['train_pairs'] + meta['eval_pairs'] == 40 and meta['eval_pairs'] > 0
  steps = meta['train_pairs'] // 2
  seen = []
  for step in range(steps):
    batch, _ = data.round_batches(1, step)
    seen += [decode(r[:r.tolist().index(ord('?'))]) for r in batch['inputs'][0, 0, ::2]]
  held = {decode(r[:r.tolist().index(ord('?'))]) for b in data.eval_batches()
          for r in b['inputs'][::2] if r.any()}
  assert len(set(seen)) == len(seen) == meta['train_pairs']
  assert not set(seen) & held and len(held) == meta['eval_pairs']


def test_what_does_not_fit_is_dropped_or_truncated_and_counted(tmp_path):
  rows = text_rows(30) + [
      {'prompt': 'P' * 30, 'chosen': 'a', 'rejected': 'b'},  # No completion token fits.
      {'prompt': 'short ', 'chosen': 'c' * 40, 'rejected': 'd'},  # Cut to seq_len + 1.
      {'prompt': 'empty ', 'chosen': '', 'rejected': 'e'}]  # Skipped: nothing to score.
  data = text_data(tmp_path, rows)
  meta = data.plan['meta']
  assert (meta['pairs'], meta['dropped_pairs'], meta['truncated_pairs']) == (32, 1, 1)
  assert data.describe()['skipped_pairs'] == 1
  line = data.config_lines()
  assert '1 skipped' in line and '1 dropped' in line and '1 truncated' in line
  long_pair = 2 * (len(rows) - 2)  # Its chosen document (pairs keep their order).
  batch = data.pack(np.array([long_pair // 2]))
  assert scored_text(batch, 0) == 'c' * (25 - len('short '))  # No EOS: it was cut.


@pytest.mark.parametrize('row, message', [
    ({'prompt': 'p', 'rejected': 'r'}, "pairs.jsonl:2: 'chosen' must be a string"),
    ({'prompt': 'p', 'chosen': 'same', 'rejected': 'same'}, 'are equal'),
    ({'chosen': 'c', 'rejected': 'r'}, "text pairs need a string 'prompt'"),
    ({'prompt': 'p', 'chosen': 'c', 'rejected': [{'role': 'assistant', 'content': 'r'}]},
     'must both be strings or both lists'),
])
def test_bad_rows_are_one_line_errors_naming_the_line(tmp_path, row, message):
  data = text_data(tmp_path, [text_rows(1)[0], row])
  with pytest.raises(UserError, match=message):
    data.store  # pylint: disable=pointless-statement


def test_files_partition_into_clients_weighted_by_their_pairs(tmp_path):
  for name, rows in (('a.jsonl', text_rows(30)), ('b.jsonl', text_rows(60)[30:])):
    write_rows(tmp_path / name, rows)
  data = PreferenceData(files=str(tmp_path / '*.jsonl'), tokenizer='bytes', seq_len=24,
                        batch_size=2, partition='file', clients_per_round=2, sampling='fixed',
                        eval_fraction=0.2)
  assert data.client_names == ('a.jsonl', 'b.jsonl')
  batch, weights = data.round_batches(0, 0)
  sizes = data.plan['client_pairs']
  np.testing.assert_array_equal(weights, sizes)
  numbers = [[int(decode(r[1:r.tolist().index(ord(':'))])) for r in slot[0, ::2]]
             for slot in batch['inputs']]
  assert all(n < 30 for n in numbers[0]) and all(n >= 30 for n in numbers[1])


def chat_pair(i: int) -> dict:
  history = [{'role': 'user', 'content': f'what is {i} plus {i}?'},
             {'role': 'assistant', 'content': f'It is {2 * i}.'},
             {'role': 'user', 'content': 'and plus 7?'}]
  return {'chosen': history + [{'role': 'assistant', 'content': f'{2 * i + 7}'}],
          'rejected': history + [{'role': 'assistant', 'content': f'{2 * i + 8} maybe'}]}


def test_chat_pairs_score_the_final_replies_only(tmp_path):
  """An implicit prompt (the messages both begin with) holds an assistant turn of its own,
  which the chat template marks as assistant output: it is not scored, the replies are."""
  tokenizer = write_family(tmp_path / 'chatml', 'chatml')
  files = write_rows(tmp_path / 'chat.jsonl', [chat_pair(i) for i in range(20)])
  data = PreferenceData(files=files, tokenizer=str(tokenizer), seq_len=96, batch_size=2,
                        eval_batch_size=2, eval_fraction=0.2)
  tok = data.loaded_tokenizer
  assert data.describe()['format'] == 'chat'
  for step in range(3):
    batch, _ = data.round_batches(0, step)
    flat = {k: v.reshape(4, 96) for k, v in batch.items()}
    for pair in range(2):
      text = tok.decode(flat['inputs'][2 * pair][flat['segment_ids'][2 * pair] > 0].tolist())
      i = int(text.split('what is ')[1].split(' ')[0])
      for row, want in ((2 * pair, f'{2 * i + 7}'), (2 * pair + 1, f'{2 * i + 8} maybe')):
        scored = flat['targets'][row][flat['mask'][row] > 0].tolist()
        assert tok.decode(scored) == want + '<|im_end|>'
