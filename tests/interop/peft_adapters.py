"""PEFT LoRA adapter directories written by the tests with numpy (what PEFT's save_pretrained
writes: adapter_config.json with its defaults, adapter_model.safetensors keyed
'base_model.model.<module>.lora_{A,B}.weight'), and the merge W + s·B·A they stand for."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

# adapter_config.json as PEFT 0.15 writes it for a plain LoRA (its keys' defaults).
DEFAULTS = dict(alpha_pattern={}, auto_mapping=None, bias='none', corda_config=None,
                eva_config=None, exclude_modules=None, fan_in_fan_out=False, inference_mode=True,
                init_lora_weights=True, layer_replication=None, layers_pattern=None,
                layers_to_transform=None, loftq_config={}, lora_bias=False, lora_dropout=0.05,
                megatron_config=None, megatron_core='megatron.core', modules_to_save=None,
                peft_type='LORA', rank_pattern={}, revision=None, task_type='CAUSAL_LM',
                trainable_token_indices=None, use_dora=False, use_rslora=False)


def modules(tensors: dict[str, np.ndarray], suffixes: tuple[str, ...]) -> list[str]:
  """The HF modules of the checkpoint `tensors` whose names end in one of `suffixes`."""
  return sorted(name[:-len('.weight')] for name in tensors
                if name.endswith('.weight') and name[:-len('.weight')].endswith(suffixes))


def write(directory: Path, tensors: dict[str, np.ndarray], adapted: list[str], base: str | None,
          r: int = 4, alpha: float = 8, seed: int = 5, **config) -> dict[str, np.ndarray]:
  """An adapter dir on the modules `adapted` of the base `tensors`, with random A and B (B not
  zero, so it changes the logits); returns its tensors."""
  rng = np.random.default_rng(seed)
  lora = {}
  for module in adapted:
    out, inp = tensors[f'{module}.weight'].shape
    key = f'base_model.model.{module}.lora_'
    lora[key + 'A.weight'] = (rng.standard_normal((r, inp)) * inp ** -0.5).astype(np.float32)
    lora[key + 'B.weight'] = (rng.standard_normal((out, r)) * 0.5).astype(np.float32)
  directory.mkdir(parents=True, exist_ok=True)
  save_file(lora, str(directory / 'adapter_model.safetensors'), metadata={'format': 'pt'})
  targets = sorted({m.rsplit('.', 1)[-1] for m in adapted})
  (directory / 'adapter_config.json').write_text(json.dumps(
      {**DEFAULTS, 'base_model_name_or_path': base, 'r': r, 'lora_alpha': alpha,
       'target_modules': targets, **config}, indent=2))
  return lora


def merged(tensors: dict[str, np.ndarray], lora: dict[str, np.ndarray], r: int, alpha: float,
           rslora: bool = False) -> dict[str, np.ndarray]:
  """The base tensors with each adapted weight W replaced by W + s·B·A (float64), s =
  alpha / r, or alpha / sqrt(r) with rsLoRA (PEFT's scaling)."""
  scale = alpha / (math.sqrt(r) if rslora else r)
  out = {k: v.astype(np.float64) for k, v in tensors.items()}
  for key in lora:
    if key.endswith('.lora_A.weight'):
      module = key[len('base_model.model.'):-len('.lora_A.weight')]
      b = lora[key.replace('lora_A', 'lora_B')].astype(np.float64)
      out[f'{module}.weight'] = out[f'{module}.weight'] + scale * b @ lora[key].astype(np.float64)
  return out
