"""split_cache: a split decodes once per prepared directory; later reads load the same arrays,
and a damaged cache file is decoded again, not trusted."""

import numpy as np

from paxlike.data import lm
from paxlike.data import prepare
from paxlike.data import split_cache


def test_a_split_decodes_once_and_reads_back_equal(tmp_path):
  calls = []

  def decode():
    calls.append(1)
    return {'text': np.arange(5, dtype=np.uint8), 'ids': np.array(['a', 'bb'])}

  first = split_cache.cached(str(tmp_path), 'train', 'kind', decode)
  again = split_cache.cached(str(tmp_path), 'train', 'kind', decode)
  assert len(calls) == 1 and again.keys() == first.keys()
  for key in first:
    np.testing.assert_array_equal(again[key], first[key])
    assert again[key].dtype == first[key].dtype
  assert [p.name for p in tmp_path.iterdir()] == ['kind-train.v1.npz']  # No temp file left.


def test_a_damaged_cache_file_is_decoded_again(tmp_path):
  split_cache.path_of(str(tmp_path), 'test', 'kind').write_bytes(b'PK\x03\x04 torn')
  got = split_cache.cached(str(tmp_path), 'test', 'kind', lambda: {'x': np.ones(3)})
  np.testing.assert_array_equal(got['x'], np.ones(3))
  np.testing.assert_array_equal(
      split_cache.cached(str(tmp_path), 'test', 'kind', lambda: {'x': np.zeros(3)})['x'],
      np.ones(3))


def test_cached_documents_equal_the_tfds_examples():
  rows = prepare.read_split(prepare.prepared('shakespeare'), 'test')
  examples = sorted(rows.__getitems__(list(range(len(rows)))), key=lambda e: e['index'])
  for _ in range(2):  # Decoded (or read from the cache), then read from the cache.
    lm._documents.cache_clear()  # pylint: disable=protected-access
    texts, ids = lm.read_documents('shakespeare', 'test')
    assert [t.tobytes() for t in texts] == [e['text'].tobytes() for e in examples]
    assert ids.tolist() == [e['client_id'].decode() for e in examples]
