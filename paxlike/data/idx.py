"""tfds builder for MNIST-format (idx, gzipped) image sets: Fashion-MNIST and MNIST."""

import dataclasses
import gzip
import pathlib

import numpy as np
import tensorflow_datasets as tfds

from paxlike.data import local_info
from paxlike.data import root
from paxlike.errors import RunFailure

FASHION_CLASSES = ('T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt',
                   'Sneaker', 'Bag', 'Ankle boot')
FILES = {'train': ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz'),
         'test': ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz')}


@dataclasses.dataclass
class IdxConfig(tfds.core.BuilderConfig):
  """`folder`: subdirectory of the data root holding the four idx .gz files."""
  folder: str = 'fashion-mnist'
  class_names: tuple[str, ...] = FASHION_CLASSES
  image_size: int = 28


def read_idx(path: pathlib.Path) -> np.ndarray:
  """Reads a gzipped idx file of unsigned bytes (magic 0x0000080N) into an array."""
  with gzip.open(path, 'rb') as f:
    data = f.read()
  if len(data) < 4 or data[:3] != b'\x00\x00\x08':
    raise RunFailure(f'corrupt idx file {path}: bad magic number')
  ndim = data[3]
  dims = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big') for i in range(ndim))
  body = np.frombuffer(data, np.uint8, offset=4 + 4 * ndim)
  if body.size != int(np.prod(dims)):
    raise RunFailure(f'corrupt idx file {path}: {body.size} bytes for shape {dims}')
  return body.reshape(dims)


class IdxImages(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Grey images + labels from `<source_dir>/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz`.

  `source_dir` defaults to `<data root>/<config.folder>`.
  """

  name = 'idx_images'
  VERSION = tfds.core.Version('1.0.0')
  # No url checksums file; also keeps tfds from importing the optional importlib_resources.
  code_path = None
  RELEASE_NOTES = {'1.0.0': 'Images (H, W, 1) uint8 and labels; upstream train/test split.'}
  BUILDER_CONFIGS = [
      IdxConfig(name='fashion_mnist'),
      IdxConfig(name='mnist', folder='mnist', class_names=tuple(map(str, range(10)))),
  ]
  PIXEL_MAX = 255

  def __init__(self, *, source_dir: str | pathlib.Path | None = None, **kwargs):
    self._source_dir = pathlib.Path(source_dir) if source_dir else None
    super().__init__(**kwargs)

  @property
  def source_dir(self) -> pathlib.Path:
    return self._source_dir or root.data_root() / self.builder_config.folder

  def source_location(self) -> pathlib.Path:
    return self.source_dir

  def source_files(self) -> dict[str, pathlib.Path]:
    """The four idx files the dataset is built from (their fingerprint keys the prepared data)."""
    return {f: root.require_file(self.source_dir / f, self.builder_config.folder)
            for fs in FILES.values() for f in fs}

  def _info(self) -> tfds.core.DatasetInfo:
    cfg = self.builder_config
    return local_info.LocalDatasetInfo(
        builder=self,
        description=f'{cfg.name} from idx files ({len(cfg.class_names)} classes).',
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Tensor(shape=(cfg.image_size, cfg.image_size, 1),
                                          dtype=np.uint8),
            'label': tfds.features.ClassLabel(names=list(cfg.class_names)),
        }),
        supervised_keys=('image', 'label'),
    )

  def _split_generators(self, dl_manager):
    files = self.source_files()
    paths = {s: [files[f] for f in fs] for s, fs in FILES.items()}
    return {s: self._generate_examples(*ps) for s, ps in paths.items()}

  def _generate_examples(self, images_path: pathlib.Path, labels_path: pathlib.Path):
    images, labels = read_idx(images_path), read_idx(labels_path)
    size = self.builder_config.image_size
    if images.shape[1:] != (size, size) or labels.shape != images.shape[:1]:
      raise RunFailure(f'idx files {images_path.name}, {labels_path.name} have shapes '
                       f'{images.shape}, {labels.shape}; expected (N, {size}, {size}), (N,)')
    if labels.size and labels.max() >= len(self.builder_config.class_names):
      raise RunFailure(f'{labels_path} has label {labels.max()} out of range')
    for i in range(len(labels)):
      yield i, {'image': images[i, :, :, None], 'label': int(labels[i])}
