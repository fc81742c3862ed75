"""Flax linen layers with logical axis annotations."""

from paxlike.layers.transformer import TransformerLM, stack_layers, unstack_layers
from paxlike.layers.vision import CnnClassifier, MlpClassifier

__all__ = ['CnnClassifier', 'MlpClassifier', 'TransformerLM', 'stack_layers', 'unstack_layers']
