"""The DatasetInfo of paxlike's builders, which read local files only."""

import tensorflow_datasets as tfds


class LocalDatasetInfo(tfds.core.DatasetInfo):
  """tfds's DatasetInfo, less the look-up of precomputed info in tfds's GCS bucket.

  A builder made before its data is prepared (every run's `prepare.source_fingerprint` and
  `declared_info`) asks tfds for that bucket's info; tfds makes an empty temporary directory
  for the download before it finds GCS off, and never removes it. Each run left one in /tmp.
  """

  def initialize_from_bucket(self) -> None:
    """Nothing to fetch: the files are local, and a prepared dataset's info is read from its
    own directory (`read_from_directory`)."""
