"""Flax linen layers with logical axis annotations."""

from paxlike.layers.transformer import TransformerLM
from paxlike.layers.vision import CnnClassifier, MlpClassifier

__all__ = ['CnnClassifier', 'MlpClassifier', 'TransformerLM']
