"""tfds builder: scikit-learn's bundled 8x8 handwritten digits (1,797 images, pixels 0..16)."""

import dataclasses
import importlib.util
import pathlib

import numpy as np
import tensorflow_datasets as tfds

from paxlike.data import local_info
from paxlike.data import split


@dataclasses.dataclass
class DigitsConfig(tfds.core.BuilderConfig):
  """`test_fraction` of each class (chosen by hash of the example index) is the test split."""
  test_fraction: float = 0.2


class Digits(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """`sklearn.datasets.load_digits()`, stratified hashed test split; needs no download."""

  name = 'digits'
  VERSION = tfds.core.Version('1.0.0')
  # No url checksums file; also keeps tfds from importing the optional importlib_resources.
  code_path = None
  RELEASE_NOTES = {'1.0.0': 'Images (8, 8, 1) uint8 in 0..16; 20% per class held out.'}
  BUILDER_CONFIGS = [DigitsConfig(name='default')]
  PIXEL_MAX = 16

  def source_location(self) -> pathlib.Path:
    """scikit-learn's bundled csv (found without importing sklearn, which takes a second)."""
    spec = importlib.util.find_spec('sklearn')
    return pathlib.Path(spec.submodule_search_locations[0]) / 'datasets' / 'data' / 'digits.csv.gz'

  def source_files(self) -> dict[str, pathlib.Path]:
    """The file the dataset is built from (its fingerprint keys the prepared data)."""
    return {'digits.csv.gz': self.source_location()}

  def _info(self) -> tfds.core.DatasetInfo:
    return local_info.LocalDatasetInfo(
        builder=self,
        description='Optical recognition of handwritten digits (UCI), as bundled in sklearn.',
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Tensor(shape=(8, 8, 1), dtype=np.uint8),
            'label': tfds.features.ClassLabel(num_classes=10),
            'index': tfds.features.Scalar(dtype=np.int64),  # Position in load_digits().
        }),
        supervised_keys=('image', 'label'),
    )

  def _split_generators(self, dl_manager):
    from sklearn import datasets  # Deferred: importing sklearn takes about a second.
    digits = datasets.load_digits()
    images = digits.images.astype(np.uint8)[..., None]
    labels = digits.target.astype(np.int64)
    keys = [f'digits/{i}' for i in range(len(labels))]
    test = split.holdout_per_group(keys, labels.tolist(), self.builder_config.test_fraction)
    return {
        'train': self._generate_examples(images, labels, np.flatnonzero(~test)),
        'test': self._generate_examples(images, labels, np.flatnonzero(test)),
    }

  def _generate_examples(self, images: np.ndarray, labels: np.ndarray, indices: np.ndarray):
    for i in indices:
      yield int(i), {'image': images[i], 'label': int(labels[i]), 'index': int(i)}
