"""Model families: one module per kind of model answers every question that depends on it.

`family_of(model)` is the `Family` (base.py) of a model, a model class or a model config:
`lm.FAMILY` for `TransformerLM`, `classifier.FAMILY` for every other model (the vision
classifiers map examples to class logits). Ask it, never the model's class: items per step and
their name, FLOPs, the memory estimate, ensemble mixing, decoding and the check of the model
against its data all live in the family's module (the data source counts its own clients).
"""

from __future__ import annotations

from typing import Any

import fiddle as fdl

from paxlike.families import classifier, lm
from paxlike.families.base import Family

__all__ = ['Family', 'family_of']


def family_of(model: Any) -> Family:
  """The family of `model`: a flax module, its class, or a `fdl.Config` of one."""
  if isinstance(model, fdl.Buildable):
    model = fdl.get_callable(model)
  return lm.FAMILY if lm.is_lm(model) else classifier.FAMILY
