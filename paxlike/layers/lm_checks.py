"""What a `TransformerLM`'s fields must satisfy to run: pure checks, raising one-line
ValueErrors (turned into exit-2 config errors by the trainer)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from paxlike.layers import lm_features, lora, moe, pipeline, quantization
from paxlike.layers.blocks import MLP_ACTIVATIONS

_dots = jax.checkpoint_policies.dots_with_no_batch_dims_saveable


def _dots_and_kernels(prim: Any, *avals: Any, **params: Any) -> bool:
  """Saves what 'dots' saves plus every Pallas kernel's outputs: the splash kernel's
  attention output and softmax statistics, so the backward pass does not run its forward
  again (on a TPU v5e that forward is ~8% of a 350M step)."""
  return prim.name == 'pallas_call' or _dots(prim, *avals, **params)


# How a scanned stack decodes (TransformerLM.decode_layers; stacking.decode_layout).
DECODE_LAYERS = ('unrolled', 'scan', 'loop')

# 'dots' saves matmul outputs without batch dims (the projections, not the [T, T] attention
# scores), so the backward pass recomputes only the cheap elementwise ops and attention;
# 'dots_attention' keeps the attention kernel's outputs too (the same as 'dots' where
# attention is XLA's: its scores are batched dots, never saved).
REMAT_POLICIES = {
    'none': None,
    'full': jax.checkpoint_policies.nothing_saveable,
    'dots': _dots,
    'dots_attention': _dots_and_kernels,
}


def check_model(model: Any, seq_len: int) -> None:
  """ValueErrors (one line each) for fields of a TransformerLM that cannot run at `seq_len`.
  `attention_impl` is checked where it is resolved (attention_kernels.resolve, a UserError)."""
  if model.head_dim is None and model.d_model % model.num_heads:
    raise ValueError(f'd_model={model.d_model} is not a multiple of num_heads={model.num_heads}')
  if model.rope and model.head_size() % 2:
    raise ValueError(f'rope needs an even head dim, got {model.head_size()}')
  lm_features.check(model)
  if not model.rope and seq_len > model.max_len:
    raise ValueError(f'sequence length {seq_len} exceeds max_len={model.max_len}')
  if model.mlp_activation not in (None, *MLP_ACTIVATIONS):
    raise ValueError(f'mlp_activation must be one of {sorted(MLP_ACTIVATIONS)} or None, '
                     f'got {model.mlp_activation!r}')
  if model.base_quantization not in quantization.KINDS:
    raise ValueError(f'base_quantization must be one of {", ".join(quantization.KINDS)}, '
                     f'got {model.base_quantization!r}')
  if model.base_quantization != 'none' and model.num_experts:
    raise ValueError('base_quantization covers dense layers only; a MoE model\'s experts '
                     'cannot be stored quantized (set num_experts=0 or base_quantization=none)')
  if model.decode_layers not in DECODE_LAYERS:
    raise ValueError(f"decode_layers must be one of {', '.join(DECODE_LAYERS)}, "
                     f'got {model.decode_layers!r}')
  if model.remat_policy not in REMAT_POLICIES:
    raise ValueError(f'remat_policy must be one of {list(REMAT_POLICIES)}, '
                     f'got {model.remat_policy!r}')
  if jnp.dtype(model.dtype) == jnp.float16 and jax.devices()[0].platform == 'cpu':
    raise ValueError('dtype float16 cannot run on CPU (XLA:CPU has no float16 matmul); '
                     'use bfloat16 or float32')
  lora.check_targets(model.lora_targets, model.lora_rank, model.gated_mlp)
  if model.num_experts:
    _check_moe(model)
  if pipeline.stage_count(jax.sharding.get_abstract_mesh()) > 1:
    _check_pipelined(model)


def _check_moe(model: Any) -> None:
  """ValueErrors for MoE fields that cannot run (see `moe.check_experts` for the mesh)."""
  moe.check_experts(model.num_experts, model.experts_per_token)
  if not isinstance(model.moe_every, int) or not 1 <= model.moe_every <= model.num_layers:
    raise ValueError(f'moe_every={model.moe_every} must be between 1 and '
                     f'num_layers={model.num_layers}')
  if model.scan_layers and model.num_layers % model.moe_every:
    raise ValueError(f'scan_layers scans groups of moe_every={model.moe_every} layers: '
                     f'num_layers={model.num_layers} must be a multiple of it')
  if model.moe_d_ff is not None and model.moe_d_ff < 1:
    raise ValueError(f'moe_d_ff must be None (d_ff) or positive, got {model.moe_d_ff}')
  if model.moe_shared_d_ff < 0:
    raise ValueError(f'moe_shared_d_ff must be 0 (none) or positive, got {model.moe_shared_d_ff}')
  if model.capacity_factor is not None and model.capacity_factor < 0:
    raise ValueError(f'capacity_factor must be None, 0 (dropless) or positive, '
                     f'got {model.capacity_factor}')


def _check_pipelined(model: Any) -> None:
  """ValueErrors for fields a stage mesh cannot pipeline (the trainer checks the batch)."""
  if not model.scan_layers:
    raise ValueError("a 'stage' mesh axis pipelines the scanned stack: set "
                     'model.scan_layers=True')
  if model.num_experts or model.dropout_rate:
    raise ValueError("a 'stage' mesh axis cannot pipeline MoE layers or dropout yet: set "
                     'model.num_experts=0 and model.dropout_rate=0')
  if lm_features.mixed_layers(model):
    raise ValueError("a 'stage' mesh axis cannot pipeline local and global layers yet: set "
                     'model.global_every=0')
