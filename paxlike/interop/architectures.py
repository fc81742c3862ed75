"""The registry of Hugging Face architectures: `model_type` -> `Architecture` (one module each).

Adding one: write `paxlike/interop/<model_type>.py` with an `ARCHITECTURE` and list the module in
`_MODULES` (README: "Adding a model family").
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping

from paxlike.errors import UserError
from paxlike.interop.architecture import Architecture
from paxlike.layers import TransformerLM

# In preference order: a model that several families could write is written as the first.
_MODULES = ('llama', 'mistral', 'qwen2', 'qwen3', 'phi3', 'gemma2', 'gemma3_text', 'mixtral',
            'qwen2_moe', 'qwen3_moe')


def _load() -> dict[str, Architecture]:
  found = {}
  for name in _MODULES:
    try:
      module = importlib.import_module(f'paxlike.interop.{name}')
    except ModuleNotFoundError as error:
      if error.name != f'paxlike.interop.{name}':
        raise
      continue  # Not written (yet).
    found[module.ARCHITECTURE.model_type] = module.ARCHITECTURE
  return found


ARCHITECTURES: dict[str, Architecture] = _load()


def supported() -> str:
  return ', '.join(sorted(ARCHITECTURES))


def architecture_for_config(hf: Mapping[str, Any]) -> Architecture:
  """The architecture of a config.json dict; UserError naming the supported model_types for an
  unknown or missing one."""
  if not isinstance(hf, Mapping):
    raise UserError('config.json does not hold a JSON object')
  model_type = hf.get('model_type')
  if model_type not in ARCHITECTURES:
    raise UserError(f'config.json model_type={model_type!r} is not supported (supported: '
                    f'{supported()})')
  return ARCHITECTURES[model_type]


def architecture_for_model(model: TransformerLM, model_type: str | None = None) -> Architecture:
  """The architecture `model` is written as: `model_type`'s (the source checkpoint's) when given,
  else the first whose `mismatches` is empty; UserError saying what prevents each."""
  if model_type is not None:
    arch = architecture_for_config({'model_type': model_type})
    problems = arch.mismatches(model)
    if problems:
      raise UserError(f'the model cannot be written as {model_type} (its source): '
                      f'{", ".join(problems)}')
    return arch
  reasons = {}
  for arch in ARCHITECTURES.values():
    problems = arch.mismatches(model)
    if not problems:
      return arch
    reasons[arch.model_type] = ', '.join(problems)
  raise UserError('the model matches no Hugging Face family: ' + '; '.join(
      f'{name}: {why}' for name, why in reasons.items()))
