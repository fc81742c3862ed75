"""The pair plan of a preference store: which pairs train, which are held out, by client, and
each document's first scored token (pure numpy over the store's arrays)."""

from __future__ import annotations

from typing import Any

import numpy as np

from paxlike.data import token_store

PLAN_VERSION = 1  # Of make_pair_plan: a store's cached plans of another version are not read.


def _run_start(trained: np.ndarray, at: int) -> int:
  """The first index of the run of True that holds `trained[at]`, else the first True after
  `at`, else len(trained)."""
  if at < len(trained) and trained[at]:
    before = np.flatnonzero(~trained[:at])
    return int(before[-1]) + 1 if len(before) else 0
  after = np.flatnonzero(trained[at:])
  return at + int(after[0]) if len(after) else len(trained)


def score_starts(store: token_store.Store) -> np.ndarray:
  """int64 [docs]: each document's first scored token. Text pairs: the prompt's length. Chat
  pairs: the first assistant token of the first assistant run that does not lie wholly in the
  tokens its pair's two conversations begin with alike (the prompt's replies, identical in
  both, are not scored); the assistant tokens from there on are scored."""
  if store.trained is None:
    return np.asarray(store.doc_prompt, np.int64)
  start = np.asarray(store.doc_start, np.int64)
  out = np.zeros(store.num_docs, np.int64)
  for pair in range(store.num_docs // 2):
    docs = (2 * pair, 2 * pair + 1)
    index = [np.arange(start[d], start[d + 1]) for d in docs]
    tokens = [store.tokens_at(i) for i in index]
    size = min(map(len, tokens))
    differ = np.flatnonzero(tokens[0][:size] != tokens[1][:size])
    common = int(differ[0]) if len(differ) else size
    for d, i in zip(docs, index):
      out[d] = _run_start(store.trained_at(i), common)
  return out


def make_pair_plan(store: token_store.Store, capacity: int, partition: str,
                   eval_fraction: float) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  """The arrays of a pair plan and its counts (what token_store.derived caches). A pair is held
  out when its chosen document's hash falls in `eval_fraction`. A sequence longer than
  `capacity` (seq_len + 1) keeps its first `capacity` tokens (its end and EOS are cut: counted
  as truncated); a pair either of whose sequences then has no scored target is dropped
  (counted): it is never trained as empty."""
  lengths = np.diff(np.asarray(store.doc_start, np.int64))
  score_from = score_starts(store)
  chosen = np.arange(store.num_docs // 2, dtype=np.int64) * 2
  first_target = np.maximum(score_from, 1)
  scored = first_target < np.minimum(lengths, capacity)
  fits = scored[chosen] & scored[chosen + 1]
  truncated = (lengths[chosen] > capacity) | (lengths[chosen + 1] > capacity)
  heldout = store.heldout(eval_fraction)[chosen]
  owner = {'pooled': np.zeros(store.num_docs, np.int64), 'file': np.asarray(store.doc_file),
           'field': np.asarray(store.doc_client)}[partition].astype(np.int64)[chosen]
  train = np.flatnonzero(fits & ~heldout)
  train = train[np.argsort(owner[train], kind='stable')]
  ids, counts = np.unique(owner[train], return_counts=True)
  arrays = {'train_pairs': train, 'eval_pairs': np.flatnonzero(fits & heldout),
            'client_rows': np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            'client_ids': ids.astype(np.int64), 'client_pairs': counts.astype(np.int64),
            'score_from': score_from}
  meta = {'pairs': len(chosen), 'train_pairs': len(train),
          'eval_pairs': len(arrays['eval_pairs']), 'dropped_pairs': int((~fits).sum()),
          'truncated_pairs': int((truncated & fits).sum())}
  return arrays, meta
