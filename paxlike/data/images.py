"""Image classification data (digits, Fashion-MNIST, MNIST) with synthetic client partitions."""

import dataclasses
import functools
from typing import Any, ClassVar

import numpy as np

from paxlike.data import partition
from paxlike.data import prepare
from paxlike.data import sources
from paxlike.data import split_cache
from paxlike.errors import UserError

IMAGE_DATASETS = ('digits', 'fashion_mnist', 'mnist')
IMAGE_PARTITIONS = ('iid', 'dirichlet', 'shards', 'similarity')


@dataclasses.dataclass(frozen=True)
class Arrays:
  """A split as arrays: uint8 images [N, H, W, 1], int32 labels [N]."""
  images: np.ndarray
  labels: np.ndarray
  pixel_max: int
  num_classes: int


@functools.lru_cache(maxsize=8)
def _arrays(dataset: str, directory: str, split: str) -> Arrays:
  found = split_cache.cached(directory, split, 'images',
                             lambda: _decoded_images(directory, split))
  images, labels = found['images'], found['labels']
  images.flags.writeable = labels.flags.writeable = False
  return Arrays(images, labels, prepare.builder_class(dataset).PIXEL_MAX,
                int(found['num_classes']))


def _decoded_images(directory: str, split: str) -> split_cache.Arrays:
  """Every example of the split parsed: images, labels and the label's class count."""
  rows = prepare.read_split(directory, split)
  examples = rows.__getitems__(list(range(len(rows))))
  return {'images': np.stack([e['image'] for e in examples]),
          'labels': np.array([e['label'] for e in examples], np.int32),
          'num_classes': np.array(rows.dataset_info.features['label'].num_classes)}


def read_arrays(dataset: str, split: str) -> Arrays:
  """A split's arrays, cached per process, per prepared directory (named by the source's
  fingerprint)."""
  return _arrays(dataset, prepare.prepared(dataset), split)


def image_batch(arrays: Arrays, index: np.ndarray, mask: np.ndarray) -> sources.Batch:
  """inputs float32 [..., H, W, 1] in [0, 1], targets int32 [...], mask float32 [...]."""
  return {'inputs': arrays.images[index].astype(np.float32) / np.float32(arrays.pixel_max),
          'targets': arrays.labels[index], 'mask': mask.astype(np.float32)}


@dataclasses.dataclass
class ImageData(sources.DataSource):
  """Image batches. The training split is partitioned into `num_clients` clients:
  'iid', 'dirichlet' (label skew, `alpha`), 'shards' (`shards_per_client` label-sorted
  shards) or 'similarity' (SCAFFOLD's: a `similarity` fraction IID, the rest label-sorted),
  all seeded by `partition_seed`; num_clients=1 is centralized training. Cohorts:
  `sampling` 'uniform' or 'weighted' each round, 'fixed' (slot i = client i every round;
  needs clients_per_round = num_clients), or 'poisson' (each client in with probability
  clients_per_round / num_clients, padded to `num_slots`). Systems heterogeneity: each round
  a client slot straggles with probability `straggler_fraction` and runs only its first
  1..local_steps-1 local steps (`sources.straggler_steps`; batches then carry
  `sources.STEP_MASK`).

  Each round a client draws local_steps x batch_size distinct examples; a client with fewer
  than that cycles through a random permutation of its data. Eval: the whole test split in
  order (or its first `num_eval_batches` batches); padding in the last batch has mask 0.
  """

  dataset: str = 'digits'
  batch_size: int = 32
  clients_per_round: int = 1
  local_steps: int = 1
  num_clients: int = 1
  partition: str = 'iid'
  alpha: float = 0.5
  shards_per_client: int = 2
  similarity: float = 0.0
  partition_seed: int = 0
  sampling: str = 'uniform'
  eval_batch_size: int = 256
  num_eval_batches: int | None = None
  straggler_fraction: float = 0.0

  item: ClassVar[sources.Item] = 'examples'

  def __post_init__(self):
    sources.check_fields(
        self, ['batch_size', 'clients_per_round', 'local_steps', 'num_clients',
               'shards_per_client', 'eval_batch_size'],
        {'dataset': IMAGE_DATASETS, 'partition': IMAGE_PARTITIONS,
         'sampling': sources.PADDED_SAMPLINGS})
    if not self.alpha > 0:
      raise UserError(f'ImageData.alpha must be > 0, got {self.alpha!r}')
    if not 0 <= self.similarity <= 1:
      raise UserError(f'ImageData.similarity must be in [0, 1], got {self.similarity!r}')
    if self.num_eval_batches is not None and self.num_eval_batches <= 0:
      raise UserError(f'ImageData.num_eval_batches must be positive or None, '
                      f'got {self.num_eval_batches!r}')
    sources.check_cohort(self, self.num_clients)
    sources.check_stragglers(self)

  def prepare(self) -> None:
    """Reads the dataset's splits (preparing them the first time)."""
    _ = self.train, self.test

  def row_spec(self) -> dict[str, sources.Spec]:
    """An example: float32 image in [0, 1], int32 label, float32 mask."""
    return {'inputs': sources.Spec(self.image_shape, np.dtype(np.float32)),
            'targets': sources.Spec((), np.dtype(np.int32)),
            'mask': sources.Spec((), np.dtype(np.float32))}

  def fingerprint(self) -> dict[str, str]:
    """The dataset's source files' fingerprint."""
    return prepare.source_fingerprint(self.dataset)

  @functools.cached_property
  def train(self) -> Arrays:
    return read_arrays(self.dataset, 'train')

  @functools.cached_property
  def test(self) -> Arrays:
    return read_arrays(self.dataset, 'test')

  @property
  def num_classes(self) -> int:
    return self.train.num_classes

  @property
  def image_shape(self) -> tuple[int, int, int]:
    """From the dataset's declared features: `--mode=print_config` prepares no data."""
    return tuple(prepare.declared_info(self.dataset).features['image'].shape)

  @functools.cached_property
  def clients(self) -> list[np.ndarray]:
    """Training-set indices of each client."""
    labels, n = self.train.labels, len(self.train.labels)
    shards = self.num_clients * (self.shards_per_client if self.partition == 'shards' else 1)
    if shards > n:
      raise UserError(f'ImageData: {shards} clients/shards for {n} {self.dataset} examples')
    if self.partition == 'iid':
      return partition.iid(n, self.num_clients, self.partition_seed)
    if self.partition == 'dirichlet':
      return partition.dirichlet(labels, self.num_clients, self.alpha, self.partition_seed)
    if self.partition == 'similarity':
      return partition.similarity(labels, self.num_clients, self.similarity, self.partition_seed)
    return partition.shards(labels, self.num_clients, self.shards_per_client,
                            self.partition_seed)

  @functools.cached_property
  def client_sizes(self) -> np.ndarray:
    """Each client's training examples."""
    return partition.client_sizes(self.clients)

  def round_batches(self, seed: int, step: int, clients: slice = slice(None),
                    rows: slice = slice(None), cohort: np.ndarray | None = None
                    ) -> tuple[sources.Batch, np.ndarray]:
    """[num_slots, local_steps, batch_size, H, W, 1] batches (only cohort slots `clients` and
    batch rows `rows` of them) and the whole cohort's FedAvg weights; a Poisson cohort's unused
    slots hold example 0 with mask 0 and weight 0, and a straggler's steps past its last have
    mask 0 (both are in the STEP_MASK). `cohort`: this round's clients instead of the sampled
    ones (DataSource.round_batches)."""
    sizes, per_client = self.client_sizes, self.local_steps * self.batch_size
    cohort = self.round_cohort(seed, step, cohort)
    rng = sources.round_rng(seed, step, sources.EXAMPLE_STREAM)
    picks = []
    for c in cohort:
      if c == sources.PADDED:
        picks.append(np.zeros(per_client, np.int64))
        continue
      n = int(sizes[c])
      local = (rng.choice(n, per_client, replace=False) if n >= per_client
               else rng.permutation(n)[np.arange(per_client) % n])
      picks.append(self.clients[c][local])
    index = np.stack(picks).reshape(len(cohort), self.local_steps, self.batch_size)
    mask = np.broadcast_to((cohort != sources.PADDED)[:, None, None], index.shape)
    index, mask = index[clients, :, rows], mask[clients, :, rows]  # A block = a slice.
    batch = sources.with_step_mask(self, image_batch(self.train, index, mask), seed, step, cohort,
                                   clients)
    return batch, sources.cohort_weights(sizes, cohort, self.sampling)

  def _eval_positions(self) -> np.ndarray:
    """[batches, eval_batch_size] test-set positions (past the end: padding)."""
    n, b = len(self.test.labels), self.eval_batch_size
    count = -(-n // b) if self.num_eval_batches is None else self.num_eval_batches
    return np.arange(count * b).reshape(count, b)

  def eval_batches(self, rows: slice = slice(None)) -> list[sources.Batch]:
    """Fixed test batches in order (rows `rows` of each); the last is padded with mask 0."""
    n, position = len(self.test.labels), self._eval_positions()[:, rows]
    batch = image_batch(self.test, position % n, position < n)
    return [{k: v[i] for k, v in batch.items()} for i in range(len(position))]

  def client_eval(self) -> sources.ClientEval | None:
    """Groups = test labels; client c's mix = its training label distribution. None for one
    client (centralized training) and for IID clients (every mix is the pooled one)."""
    if self.num_clients == 1 or self.partition == 'iid':
      return None
    hist = np.stack([np.bincount(self.train.labels[c], minlength=self.num_classes)
                     for c in self.clients]).astype(np.float64)
    n = len(self.test.labels)
    groups = [np.where(p < n, self.test.labels[p % n], -1).astype(np.int32)
              for p in self._eval_positions()]
    return sources.ClientEval(tuple(f'client{i}' for i in range(self.num_clients)), groups,
                              hist / hist.sum(axis=1, keepdims=True))

  def describe(self) -> dict[str, Any]:
    """Client and size statistics (sizes in examples)."""
    return {'dataset': self.dataset, 'partition': self.partition,
            'num_classes': self.num_classes, 'image_shape': self.image_shape,
            'test_examples': int(len(self.test.labels)), **sources.size_stats(self.client_sizes)}
