"""Data: tfds builders over local corpora, client partitions and per-round batching.

The trainer consumes a `DataSource` (`LmData`, `TextData`, `PreferenceData` or `ImageData`);
see sources.py.
"""

from paxlike.data.images import ImageData
from paxlike.data.lm import LmData
from paxlike.data.prefetch import Prefetcher
from paxlike.data.prepare import DATASETS
from paxlike.data.prepare import prepared
from paxlike.data.prepare import read_split
from paxlike.data.prepare import make_builder
from paxlike.data.root import data_root
from paxlike.data.root import prepared_dir
from paxlike.data.sources import DataSource
from paxlike.data.text_data import TextData

__all__ = ['DATASETS', 'DataSource', 'ImageData', 'LmData', 'Prefetcher', 'data_root',
           'make_builder', 'prepared', 'prepared_dir', 'read_split', 'TextData']
