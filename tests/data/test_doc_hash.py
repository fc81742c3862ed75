"""doc_hash: the bulk hash equals the formula computed per document in plain Python, whatever
the window or the chunking, and the store's held-out split is that per-document split."""

import json

import numpy as np
import pytest

from paxlike.data import doc_hash
from paxlike.data import text_files
from paxlike.data import token_store
from paxlike.tokenizers import BytesTokenizer

MASK = 2**64 - 1
TEXTS = ['', 'a', 'ab', 'ba', 'a\0', '\0a', 'café 中文 😀', 'lone \ud800 surrogate', 'x' * 300,
         'First Citizen:\nBefore we proceed any further, hear me speak.', ' ', '\n\n']


def per_document(text: str) -> int:
  """The module docstring's formula, one document at a time, in Python integers."""
  s = sum(ord(c) * pow(doc_hash.P, i, 2**64) for i, c in enumerate(text)) & MASK
  h = s ^ ((len(text) * doc_hash.M) & MASK)
  for multiplier in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53):
    h = ((h ^ (h >> 33)) * multiplier) & MASK
  return h ^ (h >> 33)


@pytest.mark.parametrize('window', [1, 2, 5, 64, doc_hash.WINDOW])
def test_bulk_hash_is_the_per_document_formula(window):
  texts = TEXTS * 3
  assert doc_hash.hashes(texts, window).tolist() == [per_document(t) for t in texts]
  ascii_only = [t for t in TEXTS if t.isascii()]
  assert doc_hash.hashes(ascii_only, window).tolist() == [per_document(t) for t in ascii_only]
  assert doc_hash.hashes([], window).dtype == np.uint64 and not len(doc_hash.hashes([]))


def test_hash_does_not_depend_on_the_chunk():
  rng = np.random.default_rng(0)
  texts = [''.join(rng.choice(list('ab é\n'), rng.integers(0, 40))) for _ in range(500)]
  whole = doc_hash.hashes(texts, 16)
  parts = np.concatenate([doc_hash.hashes(texts[i:i + 37]) for i in range(0, 500, 37)])
  assert np.array_equal(whole, parts)


def test_distinct_documents_spread_over_the_split():
  texts = [f'line {i}' for i in range(20_000)]  # Near-identical texts.
  held = doc_hash.hashes(texts) < np.uint64(int(0.1 * 2**64))
  assert 0.09 < held.mean() < 0.11
  assert 0.09 < held[:10_000].mean() < 0.11 and 0.09 < held[10_000:].mean() < 0.11


def test_the_stores_split_is_the_per_document_split(tmp_path, monkeypatch):
  monkeypatch.setenv(token_store.TOKEN_DIR_ENV, str(tmp_path / 'tokens'))
  rng = np.random.default_rng(1)
  texts = [''.join(rng.choice(list('abc dé中'), rng.integers(1, 30))) + str(i)
           for i in range(400)]
  rows = [{'prompt': t[:3], 'completion': t[3:] or '.'} for t in texts]
  (tmp_path / 'c.jsonl').write_text(''.join(json.dumps({'text': t}) + '\n' for t in texts))
  (tmp_path / 's.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  plain = token_store.open_or_build({'c.jsonl': tmp_path / 'c.jsonl'}, text_files.Fields(),
                                    BytesTokenizer(), 1)
  sft = token_store.open_or_build({'s.jsonl': tmp_path / 's.jsonl'},
                                  text_files.Fields(prompt_field='prompt'), BytesTokenizer(), 1)
  for store, documents in ((plain, texts), (sft, [f'{r["prompt"]}\0{r["completion"]}'
                                                  for r in rows])):
    expected = [per_document(d) < 0.2 * 2**64 for d in documents]
    assert store.heldout(0.2).tolist() == expected and 40 < sum(expected) < 120
