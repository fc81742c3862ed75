"""Data: tfds builders over local corpora, client partitions and per-round batching.

The trainer consumes a `DataSource` (`LmData`, `TextData` or `ImageData`); see sources.py.
"""

from paxlike.data.images import ImageData
from paxlike.data.lm import LmData
from paxlike.data.prefetch import Prefetcher
from paxlike.data.prepare import DATASETS
from paxlike.data.prepare import load_split
from paxlike.data.prepare import make_builder
from paxlike.data.root import data_root
from paxlike.data.root import prepared_dir
from paxlike.data.sources import DataSource
from paxlike.data.text_data import TextData

__all__ = ['DATASETS', 'DataSource', 'ImageData', 'LmData', 'Prefetcher', 'data_root',
           'load_split', 'make_builder', 'prepared_dir', 'TextData']
