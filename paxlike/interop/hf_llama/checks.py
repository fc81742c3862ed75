"""What the HF Llama mapping accepts: dense Llama-shaped configs and models."""

from __future__ import annotations

from typing import Any, Mapping

from paxlike.errors import UserError
from paxlike.layers import TransformerLM

# config.json keys that only mixture-of-experts architectures have.
MOE_KEYS = ('num_local_experts', 'num_experts', 'n_routed_experts', 'moe_num_experts')


def check_dense(hf: Mapping[str, Any]) -> None:
  """UserError (one line) if a HF config.json dict describes a mixture of experts."""
  model_type = str(hf.get('model_type', ''))
  experts = {k: hf[k] for k in MOE_KEYS if hf.get(k)}
  if experts or 'moe' in model_type or model_type in ('mixtral', 'dbrx', 'jamba', 'deepseek_v3'):
    found = ', '.join(f'{k}={v!r}' for k, v in {'model_type': model_type, **experts}.items())
    raise UserError(f'HF checkpoint is a mixture of experts ({found}): paxlike imports dense '
                    'Llama-style checkpoints only')


def check_model(model: TransformerLM) -> None:
  """UserError unless `model` has the (dense) Llama architecture."""
  problems = [
      f'num_experts={model.num_experts}' if model.num_experts else '',
      'use_rmsnorm=False' if not model.use_rmsnorm else '',
      'gated_mlp=False' if not model.gated_mlp else '',
      f'mlp_activation={model.mlp_activation!r}' if model.mlp_activation not in (None, 'silu') else '',
      'rope=False' if not model.rope else '',
      f'sliding_window={model.sliding_window}' if model.sliding_window is not None else '',
  ]
  if any(problems):
    raise UserError(f"HF Llama interop needs a Llama-shaped TransformerLM; this one has "
                    f"{', '.join(p for p in problems if p)}")
