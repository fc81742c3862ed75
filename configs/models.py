"""Model sizes as Fiddle configs."""

import fiddle as fdl

from paxlike.layers import CnnClassifier, MlpClassifier, TransformerLM


def lm_tiny() -> fdl.Config[TransformerLM]:
  """~0.4M parameters: CPU-sized byte LM."""
  return fdl.Config(TransformerLM, num_layers=2, d_model=128, num_heads=4, d_ff=384, max_len=128)


def lm_small() -> fdl.Config[TransformerLM]:
  """~3M parameters."""
  return fdl.Config(TransformerLM, num_layers=4, d_model=256, num_heads=8, d_ff=768, max_len=256)


def mlp(num_classes: int = 10, hidden: tuple[int, ...] = (200, 200)) -> fdl.Config[MlpClassifier]:
  return fdl.Config(MlpClassifier, num_classes=num_classes, hidden=hidden)


def cnn(num_classes: int = 10) -> fdl.Config[CnnClassifier]:
  """The FedAvg CNN of McMahan et al. 2017."""
  return fdl.Config(CnnClassifier, num_classes=num_classes)
