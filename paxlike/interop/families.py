"""The registry of Hugging Face architectures: `model_type` -> `Family` (one module each).

Adding one: write `paxlike/interop/<model_type>.py` with a `FAMILY` and list the module in
`_MODULES` (README: "Adding a model family").
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping

from paxlike.errors import UserError
from paxlike.interop.family import Family
from paxlike.layers import TransformerLM

# In preference order: a model that several families could write is written as the first.
_MODULES = ('llama', 'mistral', 'qwen2', 'qwen3', 'phi3', 'gemma2', 'gemma3_text', 'mixtral',
            'qwen2_moe', 'qwen3_moe')


def _load() -> dict[str, Family]:
  families = {}
  for name in _MODULES:
    try:
      module = importlib.import_module(f'paxlike.interop.{name}')
    except ModuleNotFoundError as error:
      if error.name != f'paxlike.interop.{name}':
        raise
      continue  # Not written (yet).
    families[module.FAMILY.model_type] = module.FAMILY
  return families


FAMILIES: dict[str, Family] = _load()


def supported() -> str:
  return ', '.join(sorted(FAMILIES))


def family_for_config(hf: Mapping[str, Any]) -> Family:
  """The family of a config.json dict; UserError naming the supported model_types for an
  unknown or missing one."""
  if not isinstance(hf, Mapping):
    raise UserError('config.json does not hold a JSON object')
  model_type = hf.get('model_type')
  if model_type not in FAMILIES:
    raise UserError(f'config.json model_type={model_type!r} is not supported (supported: '
                    f'{supported()})')
  return FAMILIES[model_type]


def family_for_model(model: TransformerLM, model_type: str | None = None) -> Family:
  """The family `model` is written as: `model_type`'s (the source checkpoint's) when given,
  else the first whose `mismatches` is empty; UserError saying what prevents each."""
  if model_type is not None:
    family = family_for_config({'model_type': model_type})
    problems = family.mismatches(model)
    if problems:
      raise UserError(f'the model cannot be written as {model_type} (its source): '
                      f'{", ".join(problems)}')
    return family
  reasons = {}
  for family in FAMILIES.values():
    problems = family.mismatches(model)
    if not problems:
      return family
    reasons[family.model_type] = ', '.join(problems)
  raise UserError('the model matches no Hugging Face family: ' + '; '.join(
      f'{name}: {why}' for name, why in reasons.items()))
