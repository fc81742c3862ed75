"""Byte-level language-model data (vocab 256) from the stdlib and Shakespeare builders."""

import dataclasses
import functools
from typing import Any, ClassVar

import numpy as np

from paxlike.data import partition
from paxlike.data import prepare
from paxlike.data import sources
from paxlike.data import split_cache
from paxlike.errors import UserError

# Each dataset's documents in source order, by the field that gives it: Shakespeare's speech
# index, the stdlib's module path. A new dataset is an entry here.
SOURCE_ORDER = {'stdlib': 'path', 'shakespeare': 'index'}
LM_DATASETS = tuple(SOURCE_ORDER)
LM_PARTITIONS = ('pooled', 'natural', 'iid', 'domains')
SEPARATOR = ord('\n')  # Appended to every document when documents are concatenated.


@functools.lru_cache(maxsize=8)
def _documents(directory: str, split: str, order: str) -> tuple[tuple, np.ndarray]:
  """(uint8 texts, str client ids) of a split of a prepared dataset, in source order (sorted by
  the examples' field `order`, see SOURCE_ORDER); decoded once per prepared directory."""
  found = split_cache.cached(directory, split, f'documents-by-{order}',
                             lambda: _decoded_documents(directory, split, order))
  ends = np.cumsum(found['lengths'])
  texts = tuple(found['text'][end - n:end] for end, n in zip(ends, found['lengths']))
  return texts, found['client_ids']


def _decoded_documents(directory: str, split: str, order: str) -> split_cache.Arrays:
  """Every example of the split parsed: texts back to back, their lengths and client ids."""
  rows = prepare.read_split(directory, split)
  examples = rows.__getitems__(list(range(len(rows))))
  examples.sort(key=lambda e: e[order])
  return {'text': np.concatenate([np.zeros(0, np.uint8)]
                                 + [np.asarray(e['text'], np.uint8) for e in examples]),
          'lengths': np.array([len(e['text']) for e in examples], np.int64),
          'client_ids': np.array([e['client_id'].decode('utf-8') for e in examples])}


def read_documents(dataset: str, split: str) -> tuple[tuple, np.ndarray]:
  """Cached per process, per prepared directory (which the source's fingerprint names)."""
  return _documents(prepare.prepared(dataset), split, SOURCE_ORDER[dataset])


@dataclasses.dataclass(frozen=True)
class Streams:
  """Clients' token streams back to back: client c is tokens[starts[c]:starts[c] + sizes[c]]."""
  tokens: np.ndarray
  starts: np.ndarray
  sizes: np.ndarray
  names: tuple[str, ...]


def concat_streams(texts: tuple, parts: list[np.ndarray], names: tuple[str, ...]) -> Streams:
  """Each client's documents, each followed by SEPARATOR, concatenated once."""
  sep = np.array([SEPARATOR], np.uint8)
  pieces = [a for p in parts for i in p for a in (texts[i], sep)]
  lengths = np.array([len(t) + 1 for t in texts], np.int64)
  sizes = np.array([lengths[p].sum() for p in parts], np.int64)
  starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
  return Streams(np.concatenate(pieces), starts, sizes, names)


def windows(tokens: np.ndarray, starts: np.ndarray, sizes: np.ndarray, offsets: np.ndarray,
            seq_len: int) -> sources.Batch:
  """LM batch of windows of seq_len + 1 tokens at `offsets` within each stream (cyclic);
  starts/sizes broadcast against offsets."""
  pos = (offsets[..., None] + np.arange(seq_len + 1)) % sizes[..., None]
  window = tokens[starts[..., None] + pos].astype(np.int32)
  return {'inputs': window[..., :-1], 'targets': window[..., 1:],
          'mask': np.ones(window[..., 1:].shape, np.float32)}


def domain_parts(texts: tuple, ids: np.ndarray, k: int,
                 dataset: str) -> tuple[list[np.ndarray], tuple[str, ...]]:
  """`partition.domains` of the documents, each domain named `FIRST..LAST` after its first and
  last natural client (in order of first appearance)."""
  if k > len(np.unique(ids)):
    raise UserError(f'LmData.num_clients={k} domains exceeds the {len(np.unique(ids))} '
                    f'{dataset} natural clients')
  parts = partition.domains(ids, [len(t) + 1 for t in texts], k)
  names = []
  for part in parts:
    members = list(dict.fromkeys(ids[part].tolist()))  # Document order = first appearance.
    names.append(f'{members[0]}..{members[-1]}' if len(members) > 1 else members[0])
  return parts, tuple(names)


@dataclasses.dataclass
class LmData(sources.DataSource):
  """Byte LM batches. partition:
  - 'pooled': one stream of all documents; every cohort slot samples it independently (the
    data-parallel setting of DiLoCo and PAPA; `sampling` is moot);
  - 'natural': one client per `client_id` (stdlib top-level module, Shakespeare role);
  - 'iid': documents dealt at random to `num_clients` clients (`partition_seed`);
  - 'domains': the natural clients grouped into `num_clients` domains (BTM experts, non-IID
    DiLoCo replicas), see `partition.domains`: in order of first appearance (Shakespeare:
    roughly by play; stdlib: by module path), cut into contiguous runs of near-equal size.
  `sampling`: 'uniform' or 'weighted' cohorts each round (sources.sample_cohort), 'fixed':
  slot i is client i every round, which needs clients_per_round = the number of clients, or
  'poisson': each client in with probability clients_per_round / clients, padded to
  `num_slots`. `straggler_fraction`: each round a slot straggles with this probability and
  runs only its first 1..local_steps-1 local steps (`sources.straggler_steps`; the batches
  then carry `sources.STEP_MASK`).

  Windows of seq_len + 1 bytes start at uniform offsets in a client's stream; a client
  shorter than that cycles its stream (nothing is masked). Clients with fewer than
  `min_client_chars` training bytes are left out of the training pool. Eval:
  `num_eval_batches` batches of evenly spaced windows over the pooled test split (a sample), or
  with None the whole split, tiled (every client's held-out text, for per-client eval).
  """

  dataset: str = 'stdlib'
  seq_len: int = 128
  batch_size: int = 16
  clients_per_round: int = 1
  local_steps: int = 1
  partition: str = 'pooled'
  sampling: str = 'uniform'
  num_clients: int = 100
  partition_seed: int = 0
  min_client_chars: int = 0
  eval_batch_size: int = 16
  num_eval_batches: int | None = 8
  straggler_fraction: float = 0.0

  item: ClassVar[sources.Item] = 'tokens'
  vocab_size: ClassVar[int] = 256  # Bytes.

  def __post_init__(self):
    sources.check_fields(
        self, ['seq_len', 'batch_size', 'clients_per_round', 'local_steps', 'num_clients',
               'eval_batch_size'],
        {'dataset': LM_DATASETS, 'partition': LM_PARTITIONS, 'sampling': sources.PADDED_SAMPLINGS})
    if self.num_eval_batches is not None and (
        isinstance(self.num_eval_batches, bool) or not isinstance(self.num_eval_batches, int)
        or self.num_eval_batches <= 0):
      raise UserError(f'LmData.num_eval_batches must be a positive int or None, '
                      f'got {self.num_eval_batches!r}')
    if self.min_client_chars < 0:
      raise UserError(f'LmData.min_client_chars must be >= 0, got {self.min_client_chars}')
    sources.check_stragglers(self)
    if self.partition in ('iid', 'domains'):  # Checked again once small clients are dropped.
      sources.check_cohort(self, self.num_clients)

  @functools.cached_property
  def train_streams(self) -> Streams:
    """The training clients' streams (loads and, the first time, prepares the dataset)."""
    texts, ids = read_documents(self.dataset, 'train')
    if self.partition == 'pooled':
      parts, names = [np.arange(len(texts))], ('pooled',)
    elif self.partition == 'natural':
      parts, names = partition.natural(ids), tuple(np.unique(ids).tolist())
    elif self.partition == 'domains':
      parts, names = domain_parts(texts, ids, self.num_clients, self.dataset)
    else:
      if self.num_clients > len(texts):
        raise UserError(f'LmData.num_clients={self.num_clients} exceeds the {len(texts)} '
                        f'{self.dataset} training documents')
      parts = partition.iid(len(texts), self.num_clients, self.partition_seed)
      names = tuple(f'client{i}' for i in range(self.num_clients))
    streams = concat_streams(texts, parts, names)
    keep = np.flatnonzero(streams.sizes >= self.min_client_chars)
    if not len(keep):
      raise UserError(f'LmData.min_client_chars={self.min_client_chars} leaves no client')
    if len(keep) < len(parts):
      streams = concat_streams(texts, [parts[i] for i in keep], tuple(names[i] for i in keep))
    if self.partition != 'pooled':
      sources.check_cohort(self, len(streams.sizes))
    return streams

  def prepare(self) -> None:
    """Reads the dataset (preparing it the first time) into the clients' and the test
    streams."""
    _ = self.train_streams, self.eval_tokens

  def row_spec(self) -> dict[str, sources.Spec]:
    """A window: int32 inputs and targets, float32 mask."""
    ints = sources.Spec((self.seq_len,), np.dtype(np.int32))
    return {'inputs': ints, 'targets': ints,
            'mask': sources.Spec((self.seq_len,), np.dtype(np.float32))}

  def fingerprint(self) -> dict[str, str]:
    """The dataset's source files' fingerprint."""
    return prepare.source_fingerprint(self.dataset)

  @property
  def client_names(self) -> tuple[str, ...]:
    """The training clients' names (the domains', the natural clients', 'pooled')."""
    return self.train_streams.names

  @property
  def client_sizes(self) -> np.ndarray:
    """Each training client's bytes (its stream's tokens)."""
    return self.train_streams.sizes

  def round_batches(self, seed: int, step: int, clients: slice = slice(None),
                    rows: slice = slice(None), cohort: np.ndarray | None = None
                    ) -> tuple[sources.Batch, np.ndarray]:
    """[num_slots, local_steps, batch_size, seq_len] batches (only cohort slots `clients` and
    batch rows `rows` of them) and the whole cohort's FedAvg weights; a Poisson cohort's
    unused slots hold client 0's windows with mask 0 and weight 0. `cohort`: this round's
    clients instead of the sampled ones (DataSource.round_batches)."""
    s, cohort = self.train_streams, self.round_cohort(seed, step, cohort)
    present, member = cohort != sources.PADDED, np.maximum(cohort, 0)
    rng = sources.round_rng(seed, step, sources.EXAMPLE_STREAM)
    sizes = s.sizes[member][:, None, None]
    offsets = rng.integers(0, np.maximum(sizes - self.seq_len, 1),
                           size=(len(cohort), self.local_steps, self.batch_size))
    batch = windows(s.tokens, s.starts[member][clients, None, None], sizes[clients],
                    offsets[clients, :, rows], self.seq_len)
    batch['mask'] = batch['mask'] * present[clients, None, None, None]
    batch = sources.with_step_mask(self, batch, seed, step, cohort, clients)
    return batch, sources.cohort_weights(s.sizes, cohort, self.sampling)

  @functools.cached_property
  def eval_tokens(self) -> np.ndarray:
    """The pooled test split as one stream."""
    texts, _ = read_documents(self.dataset, 'test')
    return concat_streams(texts, [np.arange(len(texts))], ('test',)).tokens

  def _eval_offsets(self) -> np.ndarray:
    """[batches, eval_batch_size] window starts in the test stream: `num_eval_batches` batches
    of evenly spaced windows, or (None) back-to-back windows tiling the whole stream."""
    n, b = len(self.eval_tokens), self.eval_batch_size
    if self.num_eval_batches is None:
      windows_needed = -(-(n - 1) // self.seq_len)
      return (np.arange(-(-windows_needed // b) * b, dtype=np.int64) * self.seq_len).reshape(-1, b)
    count = self.num_eval_batches * b
    offsets = np.linspace(0, max(n - self.seq_len - 1, 0), count).astype(np.int64)
    return offsets.reshape(self.num_eval_batches, b)

  def eval_batches(self, rows: slice = slice(None)) -> list[sources.Batch]:
    """The eval windows (`_eval_offsets`), rows `rows` of each batch. Tiled (None), targets
    past the end of the stream, and the padding windows filling the last batch, have mask 0,
    so every test byte after the first is a target exactly once."""
    n = len(self.eval_tokens)
    batches = []
    for offsets in self._eval_offsets():
      batch = windows(self.eval_tokens, np.int64(0), np.int64(n), offsets[rows], self.seq_len)
      if self.num_eval_batches is None:
        targets = offsets[rows, None] + np.arange(1, self.seq_len + 1)
        batch['mask'] = (targets < n).astype(np.float32)
      batches.append(batch)
    return batches

  def client_eval(self) -> sources.ClientEval | None:
    """Natural and domain partitions: each eval target token belongs to the training client
    (role, module, domain) that wrote its test document; documents of clients not trained
    (below `min_client_chars`) are in no group. None for 'pooled' and 'iid' partitions,
    whose clients have no held-out text of their own."""
    if self.partition not in ('natural', 'domains'):
      return None
    names = self.train_streams.names
    texts, ids = read_documents(self.dataset, 'test')
    client_of = self._client_of_natural_id
    doc_group = np.array([client_of.get(i, -1) for i in ids.tolist()], np.int64)
    token_group = np.repeat(doc_group, [len(t) + 1 for t in texts])  # As concat_streams.
    targets = np.arange(1, self.seq_len + 1)  # Window positions of the targets.
    groups = [token_group[(offsets[:, None] + targets) % len(token_group)].astype(np.int32)
              for offsets in self._eval_offsets()]
    return sources.ClientEval(names, groups, np.eye(len(names)))

  @functools.cached_property
  def _client_of_natural_id(self) -> dict[str, int]:
    """Training client index of each natural client id (its own, or its domain's)."""
    index = {name: i for i, name in enumerate(self.train_streams.names)}
    if self.partition == 'natural':
      return index
    texts, ids = read_documents(self.dataset, 'train')
    parts, names = domain_parts(texts, ids, self.num_clients, self.dataset)
    return {natural: index[name] for part, name in zip(parts, names) if name in index
            for natural in np.unique(ids[part]).tolist()}

  def describe(self) -> dict[str, Any]:
    """Client and size statistics (sizes in bytes = tokens)."""
    return {'dataset': self.dataset, 'partition': self.partition,
            'vocab_size': self.vocab_size, 'eval_tokens': int(len(self.eval_tokens)),
            **sources.size_stats(self.train_streams.sizes)}
