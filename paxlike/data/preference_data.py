"""`PreferenceData`: preference pairs (prompt, chosen, rejected) as padded pair batches for the
preference losses (paxlike/trainer/preference.py)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from paxlike.data import packing
from paxlike.data import preference_rows
from paxlike.data import preference_synth
from paxlike.data.preference_plan import PLAN_VERSION, make_pair_plan
from paxlike.data import sources
from paxlike.data import text_files
from paxlike.data import token_store
from paxlike.data.row_order import shuffled_rows
from paxlike.data.text_data import PARTITIONS
from paxlike.data.token_source import TokenSource, globs_of
from paxlike.errors import UserError


@dataclasses.dataclass
class PreferenceData(TokenSource):
  """Pair batches of JSONL preference rows (preference_rows.py: text or chat pairs), tokenized
  once into a token store.

  A batch holds `batch_size` pairs as 2 * batch_size padded sequences of `seq_len`: row 2i is
  pair i's prompt + chosen, row 2i + 1 its prompt + rejected, each cut to seq_len + 1 tokens
  (see make_pair_plan for what is cut, dropped and counted). Keys as a packed LM batch's
  (`inputs`, `targets`, `segment_ids`, `positions`, `mask`), `mask` marking the completions'
  targets, leading [slots, local_steps, 2 * batch_size]: a pair's two rows are adjacent, so a
  batch split evenly over devices (batch_size divisible by the data shards) keeps each pair on
  one device. Pairs are read epoch after epoch, each epoch in a fresh order of (seed, client,
  epoch), so a batch is a pure function of (seed, step). Partitions as TextData's ('file': a
  client per file; 'field': per `client_field` value), for federated preference tuning.
  """

  files: str | Sequence[str] = ()  # Globs, or preference_synth.STDLIB_PAIRS.
  tokenizer: str = 'bytes'
  seq_len: int = 512
  batch_size: int = 8  # Pairs per local step.
  eval_fraction: float = 0.05
  num_eval_batches: int | None = 4
  eval_batch_size: int = 8
  prompt_field: str = 'prompt'
  chosen_field: str = 'chosen'
  rejected_field: str = 'rejected'
  clients_per_round: int = 1
  local_steps: int = 1
  partition: str = 'pooled'
  client_field: str | None = None
  sampling: str = 'uniform'
  num_workers: int | None = None

  item: ClassVar[sources.Item] = 'tokens'
  batch_kind: ClassVar[str] = 'pairs'  # Trains with a preference loss (trainer/preference.py).
  DATASET = 'preference'
  CACHED = ('store', 'plan', 'row_plan')

  def __post_init__(self):
    sources.check_fields(
        self, ['seq_len', 'batch_size', 'clients_per_round', 'local_steps', 'eval_batch_size'],
        {'partition': PARTITIONS, 'sampling': sources.SAMPLINGS})
    globs = [self.files] if isinstance(self.files, str) else self.files
    if not isinstance(globs, (list, tuple)) or not globs or not all(
        isinstance(g, str) and g for g in globs):
      raise UserError(f'PreferenceData.files must be a glob or a list of globs, got '
                      f'{self.files!r}')
    for name in ('tokenizer', 'prompt_field', 'chosen_field', 'rejected_field'):
      if not isinstance(getattr(self, name), str) or not getattr(self, name):
        raise UserError(f'PreferenceData.{name} must be a non-empty string, got '
                        f'{getattr(self, name)!r}')
    if (self.partition == 'field') != (self.client_field is not None):
      raise UserError("PreferenceData: partition='field' and client_field go together; got "
                      f'partition={self.partition!r}, client_field={self.client_field!r}')
    if not isinstance(self.eval_fraction, (int, float)) or not 0 < self.eval_fraction < 1:
      raise UserError(f'PreferenceData.eval_fraction must be in (0, 1), got '
                      f'{self.eval_fraction!r}')
    for name in ('num_eval_batches', 'num_workers'):
      value = getattr(self, name)
      if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                or value <= 0):
        raise UserError(f'PreferenceData.{name} must be a positive int or None, got {value!r}')

  @property
  def pair_fields(self) -> preference_rows.PairFields:
    return preference_rows.PairFields(self.prompt_field, self.chosen_field,
                                      self.rejected_field,
                                      self.client_field if self.partition == 'field' else None)

  @functools.cached_property
  def documents(self) -> tuple[dict[str, Path], dict[str, Any]]:
    """The pair documents (preference_rows.pair_files) and their counts."""
    return preference_rows.pair_files(text_files.expand(preference_synth.with_synthetic(
        globs_of(self.files))),
                                      self.pair_fields)

  @functools.cached_property
  def store(self) -> token_store.Store:
    """The token store of the pair documents (built the first time, by any run)."""
    files, counts = self.documents
    store = self.open_store(files, preference_rows.store_fields(counts['format'],
                                                                self.pair_fields),
                            chat=counts['format'] == 'chat')
    if store.num_docs != 2 * counts['pairs']:
      raise UserError(f'data.files: {counts["pairs"]} pairs became {store.num_docs} documents '
                      f'({store.manifest.get("counts")}); every pair needs both of its two')
    return store

  @functools.cached_property
  def plan(self) -> dict[str, np.ndarray]:
    """The pair plan's arrays and (key 'meta') counts, computed once per store, seq_len,
    partition and eval_fraction."""
    store = self.store
    name = f'pairs-seq{self.seq_len}-{self.partition}-eval{self.eval_fraction:.9g}'
    arrays, meta = token_store.derived(store, name, PLAN_VERSION, lambda: make_pair_plan(
        store, self.seq_len + 1, self.partition, self.eval_fraction))
    if not meta['train_pairs'] or not meta['eval_pairs']:
      raise UserError(f'PreferenceData: {meta["train_pairs"]} training and {meta["eval_pairs"]} '
                      f'held-out pairs of {meta["pairs"]} ({meta["dropped_pairs"]} dropped: '
                      f'no completion token within seq_len={self.seq_len}); both splits need '
                      'some: change eval_fraction or seq_len, or add pairs')
    if self.partition != 'pooled':
      sources.check_cohort(self, len(arrays['client_pairs']))
    return {**arrays, 'meta': meta}

  @functools.cached_property
  def row_plan(self) -> packing.Plan:
    """Each document alone in a row, cut to seq_len + 1 tokens."""
    lengths = np.diff(np.asarray(self.store.doc_start, np.int64))
    n = len(lengths)
    return packing.Plan(np.arange(n, dtype=np.int64), np.zeros(n, np.int64),
                        np.minimum(lengths, self.seq_len + 1), np.arange(n + 1, dtype=np.int64))

  def pack(self, pairs: np.ndarray) -> sources.Batch:
    """The batch of pair ids `pairs` (any shape S; -1: an empty pair), rows [*S[:-1], 2 *
    S[-1], seq_len]: each pair's chosen row, then its rejected row."""
    pairs = np.asarray(pairs, np.int64)
    docs = np.stack([2 * pairs, 2 * pairs + 1], axis=-1)
    docs = np.where(pairs[..., None] >= 0, docs, -1).reshape(*pairs.shape[:-1], -1)
    store = self.store
    return packing.pack_rows(self.row_plan, docs, store.doc_start, store.tokens_at,
                             self.seq_len + 1, store.manifest['tokenizer']['pad_id'],
                             self.plan['score_from'],
                             None if store.trained is None else store.trained_at)

  def prepare(self) -> None:
    """Opens (or builds) the token store, then reads (or computes) its pair plan."""
    _ = self.plan

  def round_batches(self, seed: int, step: int, clients: slice = slice(None),
                    rows: slice = slice(None), cohort: np.ndarray | None = None
                    ) -> tuple[sources.Batch, np.ndarray]:
    """[slots, local_steps, 2 * batch_size, seq_len] batches (cohort slots `clients`, batch
    rows `rows` of them) and the cohort's weights (its clients' training pairs; a PADDED slot
    reads client 0's pairs with weight 0). `cohort`: this round's clients instead of the
    sampled ones (DataSource.round_batches)."""
    plan, k, steps = self.plan, self.clients_per_round, self.local_steps
    cohort = self.round_cohort(seed, step, cohort)
    slots = np.arange(len(cohort))[clients][:, None, None]
    local = np.arange(steps)[None, :, None]
    row = np.arange(self.batch_size)[None, None, :]
    rounds = step * k + slots if self.pooled else np.full_like(slots, step)
    positions = (rounds * steps + local) * self.batch_size + row
    member = np.broadcast_to(np.maximum(cohort, 0)[slots], positions.shape)
    picked = shuffled_rows(seed, member, positions, plan['client_rows'])
    pairs = np.asarray(plan['train_pairs'])[picked]
    start, stop, _ = rows.indices(2 * self.batch_size)
    needed = pairs[..., start // 2:(stop + 1) // 2]
    batch = self.pack(needed)
    cut = slice(start - 2 * (start // 2), stop - 2 * (start // 2))
    return ({k: v[:, :, cut] for k, v in batch.items()},
            sources.cohort_weights(self.client_sizes, cohort, self.sampling))

  def _eval_pairs(self) -> np.ndarray:
    """[batches, eval_batch_size] held-out pairs (-1: empty), as TextData's eval rows."""
    n, b = len(self.plan['eval_pairs']), self.eval_batch_size
    count = math.ceil(n / b) * b if self.num_eval_batches is None else self.num_eval_batches * b
    at = (np.linspace(0, n - 1, count).astype(np.int64) if n >= count else
          np.concatenate([np.arange(n), np.full(count - n, -1)]).astype(np.int64))
    pairs = np.asarray(self.plan['eval_pairs'])
    return np.where(at >= 0, pairs[np.maximum(at, 0)], -1).reshape(-1, b)

  def eval_batches(self, rows: slice = slice(None)) -> list[sources.Batch]:
    """The held-out pairs, each batch [2 * eval_batch_size, seq_len] cut to rows `rows`."""
    return [{k: v[rows] for k, v in self.pack(pairs).items()} for pairs in self._eval_pairs()]

  @property
  def client_sizes(self) -> np.ndarray:
    """Each training client's training pairs ('pooled': one client)."""
    return self.plan['client_pairs']

  @property
  def client_names(self) -> tuple[str, ...]:
    """Each training client's file name or client_field value ('pooled': one)."""
    if self.pooled:
      return ('pooled',)
    names = (self.store.manifest['files'] if self.partition == 'file' else
             token_store.client_names(self.store))
    return tuple(names[i] for i in self.plan['client_ids'].tolist())

  def config_lines(self) -> str:
    """'# preference pairs: ...': the pairs trained and held out, and those skipped, dropped
    and truncated."""
    meta, (_, counts) = self.plan['meta'], self.documents
    return (f"# preference pairs ({counts['format']}): {meta['train_pairs']:,} train, "
            f"{meta['eval_pairs']:,} held out; {counts['skipped_pairs']:,} skipped (an empty "
            f"completion), {meta['dropped_pairs']:,} dropped (no completion token within "
            f"data.seq_len={self.seq_len}), {meta['truncated_pairs']:,} truncated (cut to "
            f'seq_len + 1 tokens: the end of the completion and its EOS are not scored)\n')

  def describe(self) -> dict[str, Any]:
    """Pair counts (kept, held out, skipped, dropped, truncated) and the store."""
    _, counts = self.documents
    return {'dataset': 'preference', 'format': counts['format'],
            'skipped_pairs': counts['skipped_pairs'], **self.plan['meta'],
            'tokenizer': self.store.manifest['tokenizer']['kind'],
            'vocab_size': self.vocab_size, 'seq_len': self.seq_len,
            'partition': self.partition, 'store': str(self.store.path),
            **sources.size_stats(self.plan['client_pairs'])}
