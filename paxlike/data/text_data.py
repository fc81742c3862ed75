"""`TextData`: a user's own corpus as packed, tokenized LM batches (see TextData)."""

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from paxlike.data import packing
from paxlike.data import sources
from paxlike.data import text_files
from paxlike.data import token_store
from paxlike.data.row_order import shuffled_rows
from paxlike.data.token_source import TokenSource
from paxlike.errors import UserError

PARTITIONS = ('pooled', 'file', 'field')
PLAN_ARRAYS = ('doc', 'offset', 'length', 'row_start')


@dataclasses.dataclass(frozen=True)
class Packed:
  """The packing of a store for one (seq_len, partition, eval_fraction): training rows, client
  c's being train rows client_rows[c]:client_rows[c + 1], and the held-out rows."""

  train: packing.Plan
  client_rows: np.ndarray  # int64 [clients + 1]
  client_tokens: np.ndarray  # int64 [clients]: training tokens (the FedAvg sizes).
  client_ids: np.ndarray  # int64 [clients]: each client's file / client_field index.
  eval: packing.Plan
  meta: dict[str, Any]


def make_packed(store: token_store.Store, capacity: int, partition: str,
                eval_fraction: float) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  """The arrays and metadata of `Packed` (what `token_store.derived` caches)."""
  lengths = np.diff(np.asarray(store.doc_start))
  heldout = store.heldout(eval_fraction)
  owner = {'pooled': np.zeros(store.num_docs, np.int64), 'file': np.asarray(store.doc_file),
           'field': np.asarray(store.doc_client)}[partition].astype(np.int64)
  train_docs = np.flatnonzero(~heldout)
  ids, counts = np.unique(owner[train_docs], return_counts=True)
  by_client = np.split(train_docs[np.argsort(owner[train_docs], kind='stable')],
                       np.cumsum(counts)[:-1])
  has_target = target_filter(store)
  plans = [packing.make_plan(lengths, docs, capacity, has_target) for docs in by_client]
  train, client_rows = (packing.concat_plans(plans) if plans else
                        (packing.make_plan(lengths, train_docs, capacity, has_target),
                         np.zeros(1, np.int64)))
  evals = packing.make_plan(lengths, np.flatnonzero(heldout), capacity, has_target)
  piece_doc, offset, length = packing.split_documents(lengths[train_docs], capacity)
  kept = (np.ones(len(piece_doc), bool) if has_target is None else
          np.asarray(has_target(train_docs[piece_doc], offset, length), bool))
  arrays = {**{f'train_{k}': getattr(train, k) for k in PLAN_ARRAYS},
            **{f'eval_{k}': getattr(evals, k) for k in PLAN_ARRAYS},
            'client_rows': client_rows, 'client_ids': ids.astype(np.int64),
            'client_tokens': np.array([lengths[d].sum() for d in by_client], np.int64)}
  meta = {'packing_efficiency': packing.efficiency(train, capacity),
          'eval_packing_efficiency': packing.efficiency(evals, capacity),
          'train_documents': len(train_docs), 'eval_documents': int(heldout.sum()),
          'eval_tokens': int(lengths[heldout].sum()),
          'targetless_pieces': int((~kept).sum()),
          'documents_with_targetless_pieces': len(np.unique(piece_doc[~kept])),
          'targetless_documents': len(train_docs) - len(np.unique(piece_doc[kept]))}
  return arrays, meta


def target_filter(store: token_store.Store) -> packing.PieceFilter | None:
  """Which pieces (doc, offset, length) hold a scored target: one past the prompt (SFT) or an
  assistant token (chat); None for plain text, where every piece of two tokens does."""
  start = np.asarray(store.doc_start, np.int64)
  if store.trained is not None:  # Chat: count the assistant tokens among each piece's targets.
    scored = np.concatenate([[0], np.cumsum(store.trained, dtype=np.int64)])
    return lambda doc, offset, length: (
        scored[start[doc] + offset + length] - scored[start[doc] + offset + 1] > 0)
  prompt = np.asarray(store.doc_prompt, np.int64)
  if not prompt.any():
    return None
  return lambda doc, offset, length: (length >= 2) & (offset + length - 1 >= prompt[doc])


@dataclasses.dataclass
class TextData(TokenSource):
  """LM batches of a user's files, tokenized once into a token store and packed.

  `files`: a glob or a list of globs of .txt / .jsonl / .jsonl.gz / .parquet files, read as
  `fields` (text_files.Fields) says: JSONL and Parquet documents are each row's
  `fields.text_field`, a .txt file is one document per file, per line or per paragraph
  (`fields.txt_document`). SFT: with `fields.prompt_field` set, each row is a prompt +
  completion example and only the completion's tokens and its EOS are targets. Chat: with
  `fields.messages_field` set, each row's messages are rendered with the chat template beside the
  tokenizer (a Hugging Face tokenizer.json) and only the assistant's tokens are targets
  (paxlike/tokenizers/chat_encoder.py). `tokenizer`:
  'bytes' or a tokenizer path (paxlike.tokenizers). A document is held out for eval when the
  hash of its text falls in `eval_fraction`, so adding files never moves a document between
  splits. Partitions: 'pooled' (one stream; each cohort slot reads its own rows), 'file' (one
  client per file), 'field' (one client per value of `fields.client_field`); cohorts are drawn by
  `sampling` as in LmData ('poisson' too, for DP's accounting, but not when pooled), clients
  weighted by their training tokens. `straggler_fraction` as in LmData: a straggling slot runs
  only its first 1..local_steps-1 local steps.

  Batches: `inputs`, `targets`, `segment_ids`, `positions` (int32) and `mask` (float32), see
  packing.py. Each client's rows are read epoch after epoch, each epoch in a fresh order of
  (seed, client, epoch); round `step`'s rows are positions `step * local_steps * batch_size +
  ...` of that sequence (pooled: of `step * clients_per_round + slot`), so a batch is a pure
  function of (seed, step) and a process builds only its own block of it.

  Loader: the trainer's one prefetch thread (data.prefetch) calling round_batches, kept over
  grain's multi-process loader by measurement (docs/benchmarks.md, data_pipeline.py's
  loader); grain's packers pack a stream as it is iterated, so a batch would depend on the
  iterator's state, while the whole-corpus plan keeps it a function of (seed, step) alone.
  """

  files: str | Sequence[str] = ()
  fields: text_files.Fields = text_files.Fields()  # Which row fields are read, and how.
  tokenizer: str = 'bytes'
  seq_len: int = 512
  batch_size: int = 16
  eval_fraction: float = 0.01
  num_eval_batches: int | None = 8
  eval_batch_size: int = 16
  clients_per_round: int = 1
  local_steps: int = 1
  partition: str = 'pooled'
  sampling: str = 'uniform'
  straggler_fraction: float = 0.0
  num_workers: int | None = None  # Store-build encoders (token_build.py); None: os.cpu_count().

  item: ClassVar[sources.Item] = 'tokens'

  def __post_init__(self):
    sources.check_fields(
        self, ['seq_len', 'batch_size', 'clients_per_round', 'local_steps', 'eval_batch_size'],
        {'partition': PARTITIONS, 'sampling': sources.PADDED_SAMPLINGS})
    if self.sampling == 'poisson' and self.partition == 'pooled':
      raise UserError("TextData: sampling='poisson' draws clients, and partition='pooled' has "
                      "none: use partition='file' or 'field'")
    globs = [self.files] if isinstance(self.files, str) else self.files
    if not isinstance(globs, (list, tuple)) or not globs or not all(
        isinstance(g, str) and g for g in globs):
      raise UserError(f'TextData.files must be a glob or a list of globs, got {self.files!r}')
    if not isinstance(self.tokenizer, str) or not self.tokenizer:
      raise UserError(f'TextData.tokenizer must be a non-empty string, got {self.tokenizer!r}')
    if not isinstance(self.fields, text_files.Fields):
      raise UserError(f'TextData.fields must be a paxlike.data.text_files.Fields, got '
                      f'{self.fields!r}')
    if (self.partition == 'field') != (self.fields.client_field is not None):
      raise UserError("TextData: partition='field' and fields.client_field go together; got "
                      f'partition={self.partition!r}, client_field={self.fields.client_field!r}')
    if not isinstance(self.eval_fraction, (int, float)) or not 0 < self.eval_fraction < 1:
      raise UserError(f'TextData.eval_fraction must be in (0, 1), got {self.eval_fraction!r}')
    sources.check_stragglers(self)
    for name in ('num_eval_batches', 'num_workers'):
      value = getattr(self, name)
      if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                or value <= 0):
        raise UserError(f'TextData.{name} must be a positive int or None, got {value!r}')

  CACHED = ('store', 'packed')

  @functools.cached_property
  def store(self) -> token_store.Store:
    """The token store of the files (built the first time, by any run)."""
    return self.open_store(text_files.expand(self.files), self.fields,
                           chat=self.fields.messages_field is not None)

  def prepare(self) -> None:
    """Opens (or builds) the token store, then reads (or computes) its packing plan."""
    _ = self.packed

  @functools.cached_property
  def packed(self) -> Packed:
    """The packing plan (computed once per store, seq_len, partition and eval_fraction)."""
    capacity, store = self.seq_len + 1, self.store
    name = f'plan-seq{self.seq_len}-{self.partition}-eval{self.eval_fraction:.9g}'
    arrays, meta = token_store.derived(
        store, name, packing.PLAN_VERSION,
        lambda: make_packed(store, capacity, self.partition, self.eval_fraction))
    plan = lambda split: packing.Plan(*(arrays[f'{split}_{k}'] for k in PLAN_ARRAYS))
    packed = Packed(plan('train'), arrays['client_rows'], arrays['client_tokens'],
                    arrays['client_ids'], plan('eval'), meta)
    if not packed.eval.num_rows or not packed.train.num_rows:
      raise UserError(f'TextData.eval_fraction={self.eval_fraction} holds out '
                      f'{meta["eval_documents"]} of the {store.num_docs} documents; '
                      'both splits need some: change eval_fraction or add documents')
    if self.partition != 'pooled':
      sources.check_cohort(self, len(packed.client_tokens))
    return packed

  def _batch(self, plan: packing.Plan, rows: np.ndarray) -> sources.Batch:
    store = self.store
    return packing.pack_rows(plan, rows, store.doc_start, store.tokens_at, self.seq_len + 1,
                             store.manifest['tokenizer']['pad_id'], store.doc_prompt,
                             None if store.trained is None else store.trained_at)

  def round_batches(self, seed: int, step: int, clients: slice = slice(None),
                    rows: slice = slice(None), cohort: np.ndarray | None = None
                    ) -> tuple[sources.Batch, np.ndarray]:
    """[num_slots, local_steps, batch_size, seq_len] batches (cohort slots `clients` and
    batch rows `rows` of them) and the whole cohort's weights; a Poisson cohort's unused slots
    hold client 0's rows with mask 0 (no local step runs) and weight 0. `cohort`: this round's
    clients instead of the sampled ones (DataSource.round_batches)."""
    p, k, steps = self.packed, self.clients_per_round, self.local_steps
    cohort = self.round_cohort(seed, step, cohort)
    slots = np.arange(len(cohort))[clients][:, None, None]
    local = np.arange(steps)[None, :, None]
    row = np.arange(self.batch_size)[rows][None, None, :]
    rounds = step * k + slots if self.pooled else np.full_like(slots, step)
    positions = (rounds * steps + local) * self.batch_size + row
    member = np.maximum(cohort, 0)[slots]
    picked = shuffled_rows(seed, np.broadcast_to(member, positions.shape), positions,
                           p.client_rows)
    batch = sources.with_step_mask(self, self._batch(p.train, picked), seed, step, cohort,
                                   clients)
    return batch, sources.cohort_weights(p.client_tokens, cohort, self.sampling)

  def _eval_rows(self) -> np.ndarray:
    """[batches, eval_batch_size] held-out rows (-1: an empty row): all of them (None), else
    `num_eval_batches` batches of evenly spaced rows (all rows, then empty ones, if fewer)."""
    n, b = self.packed.eval.num_rows, self.eval_batch_size
    count = math.ceil(n / b) * b if self.num_eval_batches is None else self.num_eval_batches * b
    if n >= count:
      return np.linspace(0, n - 1, count).astype(np.int64).reshape(-1, b)
    return np.concatenate([np.arange(n), np.full(count - n, -1)]).astype(np.int64).reshape(-1, b)

  def eval_batches(self, rows: slice = slice(None)) -> list[sources.Batch]:
    """The held-out rows (`_eval_rows`), rows `rows` of each batch; empty rows are all masked."""
    return [self._batch(self.packed.eval, picked[rows]) for picked in self._eval_rows()]

  def client_eval(self) -> sources.ClientEval | None:
    """'file' and 'field' partitions: each held-out target belongs to the training client of
    its document (-1: padding, or a client with no training documents); None when pooled."""
    if self.partition == 'pooled':
      return None
    p, store = self.packed, self.store
    owner = np.asarray(store.doc_file if self.partition == 'file' else store.doc_client)
    index = np.full(int(owner.max()) + 1, -1, np.int32)
    index[p.client_ids] = np.arange(len(p.client_ids), dtype=np.int32)
    groups = []
    for picked in self._eval_rows():
      docs = packing.target_docs(p.eval, picked, self.seq_len + 1)
      groups.append(np.where(docs >= 0, index[owner[np.maximum(docs, 0)]], -1).astype(np.int32))
    return sources.ClientEval(self.client_names, groups, np.eye(len(p.client_ids)))

  @property
  def client_sizes(self) -> np.ndarray:
    """Each training client's training tokens ('pooled': one client)."""
    return self.packed.client_tokens

  @property
  def client_names(self) -> tuple[str, ...]:
    """Each training client's file name or client_field value ('pooled': one)."""
    if self.pooled:
      return ('pooled',)
    names = (self.store.manifest['files'] if self.partition == 'file' else
             token_store.client_names(self.store))
    return tuple(names[i] for i in self.packed.client_ids.tolist())

  def config_lines(self) -> str:
    """The packing efficiency, and what is left out for holding no target."""
    return packing.plan_lines(self.packed.meta)

  def describe(self) -> dict[str, Any]:
    """Corpus, store, packing and client statistics (sizes in training tokens)."""
    manifest = self.store.manifest
    return {'dataset': 'text', 'files': len(manifest['files']),
            'documents': manifest['num_docs'], 'tokens': manifest['num_tokens'],
            'tokenizer': manifest['tokenizer']['kind'], 'vocab_size': self.vocab_size,
            'seq_len': self.seq_len, 'partition': self.partition, 'store': str(self.store.path),
            'train_rows': self.packed.train.num_rows, 'eval_rows': self.packed.eval.num_rows,
            **self.packed.meta, **sources.size_stats(self.packed.client_tokens)}
