"""What the mixture-of-experts families (Mixtral, Qwen2-MoE, Qwen3-MoE) share: their routers'
config.json fields both ways, what a model must be to be written as one, and their experts'
tensors in both checkpoint layouts.

Routers (transformers' MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock, Qwen3MoeSparseMoeBlock):
softmax over all experts, top-k, the k weights renormalised (Mixtral always, Qwen-MoE when
`norm_topk_prob`), every token through its k experts: paxlike's `moe.MoeMlp` with
`capacity_factor=None` (dropless) and `moe_renormalize`. An imported model is dropless; a model
trained with a capacity exports all the same (transformers runs it dropless: at decode, one token
per step, paxlike never drops either). The load-balancing loss transformers adds in training
(`output_router_logits`, weight `router_aux_loss_coef` on k × paxlike's balance loss: it sums
over the k choices where paxlike averages) becomes `aux_loss_weight`; transformers has no
z-loss.

Per-expert layout (published checkpoints; transformers' save_pretrained writes it too):

    {moe}.gate.weight                  [E, d]      mlp/router                 [d, E]
    {moe}.experts.{e}.{gate}.weight    [f, d]      mlp/wi_gate  row e of      [E, d, f]
    {moe}.experts.{e}.{up}.weight      [f, d]      mlp/wi_up    row e of      [E, d, f]
    {moe}.experts.{e}.{down}.weight    [d, f]      mlp/wo       row e of      [E, f, d]

with {moe}, (gate, up, down) = block_sparse_moe, (w1, w3, w2) for Mixtral and mlp, (gate_proj,
up_proj, down_proj) for Qwen-MoE. Fused layout (transformers 5's modules; read on import):

    mlp.gate.weight                    [E, d]      mlp/router
    mlp.experts.gate_up_proj           [E, 2f, d]  mlp/wi_gate, mlp/wi_up  (gate rows first)
    mlp.experts.down_proj              [E, d, f]   mlp/wo

Qwen2-MoE's shared expert: mlp.shared_expert.{gate,up,down}_proj.weight -> mlp/shared_expert/
{wi_gate,wi_up,wo}/kernel; mlp.shared_expert_gate.weight [1, d] -> mlp/shared_gate [d, 1].
"""

from __future__ import annotations

from typing import Any, Collection, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from paxlike.errors import UserError
from paxlike.interop import hf_fields, llama
from paxlike.interop.architecture import NameMap, Tensor, expert_row, transposed
from paxlike.layers import TransformerLM

# Keys the router and its training loss take, beside each family's own.
ROUTER_KEYS = {'num_experts_per_tok', 'output_router_logits', 'router_aux_loss_coef'}
FUSED = 'mlp.experts.gate_up_proj'  # A fused checkpoint has this tensor in each MoE layer.


def router_fields(hf: Mapping[str, Any], experts_key: str, renormalize: bool) -> dict[str, Any]:
  """The MoE fields of a config.json dict whose expert count is under `experts_key`."""
  experts, k = hf.get(experts_key), hf.get('num_experts_per_tok')
  for key, value in ((experts_key, experts), ('num_experts_per_tok', k)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise UserError(f'config.json {key}={value!r} is not a positive integer')
  if k > experts:
    raise UserError(f'config.json num_experts_per_tok={k} exceeds {experts_key}={experts}')
  coef = float(hf.get('router_aux_loss_coef') or 0.0)
  return dict(num_experts=experts, experts_per_token=k, capacity_factor=None,
              moe_renormalize=renormalize, router_z_loss_weight=0.0,
              aux_loss_weight=coef * k if hf.get('output_router_logits') else 0.0)


def router_config(model: TransformerLM) -> dict[str, Any]:
  """config.json's router keys of `model` (the inverse of `router_fields`, bar the count)."""
  k = model.experts_per_token
  return {'num_experts_per_tok': k, 'output_router_logits': model.aux_loss_weight > 0,
          'router_aux_loss_coef': model.aux_loss_weight / k if model.aux_loss_weight else 0.001}


def mismatches(model: TransformerLM, allowed: Collection[str], renormalize: bool | None,
               shared: bool = False, every: bool = False) -> list[str]:
  """Why `model` is not this MoE family: dense features outside `allowed`, no experts, a router
  that does (not) renormalise where the family does not (does; None: either, a config key),
  a shared expert where it has none (`shared`), MoE layers not in every layer (`every`)."""
  out = hf_fields.unsupported(model, {*allowed, 'num_experts'})
  if not model.num_experts:
    return out + ['num_experts=0']
  if renormalize is not None and renormalizes(model) != renormalize:
    out.append(f'moe_renormalize={model.moe_renormalize!r} with experts_per_token='
               f'{model.experts_per_token}')
  if model.moe_shared_d_ff and not shared:
    out.append(f'moe_shared_d_ff={model.moe_shared_d_ff}')
  if model.moe_every != 1 and not every:
    out.append(f'moe_every={model.moe_every}')
  return out


def renormalizes(model: TransformerLM) -> bool:
  """Whether `model`'s router renormalises its top-k weights."""
  if model.moe_renormalize is None:
    return model.experts_per_token > 1
  return model.moe_renormalize


def expert_names(model: TransformerLM, block: str, projections: tuple[str, str, str]
                 ) -> dict[str, Tensor]:
  """A MoE layer's router and experts in the per-expert layout (suffixes after the layer)."""
  names = {f'{block}.gate.weight': transposed(('mlp', 'router'))}
  for e in range(model.num_experts):
    for hf, pax in zip(projections, ('wi_gate', 'wi_up', 'wo')):
      names[f'{block}.experts.{e}.{hf}.weight'] = expert_row(('mlp', pax), e,
                                                             lambda w: w.T, lambda p: p.T)
  return names


def fused_expert_names(model: TransformerLM) -> dict[str, Tensor]:
  """A MoE layer's router and experts in transformers 5's fused layout."""
  f = model.moe_d_ff or model.d_ff
  swap = lambda w: np.swapaxes(w, 1, 2)

  def split(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return swap(w[:, :f]), swap(w[:, f:])

  def join(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    numpy = jnp if isinstance(gate, jax.core.Tracer) else np  # Traced by check_shapes.
    return numpy.concatenate([swap(gate), swap(up)], axis=1)

  gate_up = Tensor((('mlp', 'wi_gate'), ('mlp', 'wi_up')), split, join)
  return {'mlp.gate.weight': transposed(('mlp', 'router')), FUSED: gate_up,
          'mlp.experts.down_proj': Tensor((('mlp', 'wo'),), lambda w: (swap(w),), swap)}


def shared_expert_names() -> dict[str, Tensor]:
  """Qwen2-MoE's shared expert and its sigmoid gate."""
  names = {f'mlp.shared_expert.{hf}.weight': transposed(('mlp', 'shared_expert', pax, 'kernel'))
           for hf, pax in (('gate_proj', 'wi_gate'), ('up_proj', 'wi_up'),
                           ('down_proj', 'wo'))}
  return {**names, 'mlp.shared_expert_gate.weight': transposed(('mlp', 'shared_gate'))}


def decoder_names(model: TransformerLM, moe_layer: Mapping[str, Tensor]) -> NameMap:
  """The whole checkpoint: attention and norms in every layer, `moe_layer` in MoE layers and
  the dense MLP (mlp.{gate,up,down}_proj) in the others."""
  names = llama.decoder_names(model, {**llama.attention_names(model), **llama.norm_names()})
  for i in range(model.num_layers):
    layer = moe_layer if model.is_moe_layer(i) else llama.mlp_names()
    for suffix, t in layer.items():
      names[f'model.layers.{i}.{suffix}'] = t._replace(
          paths=tuple((f'block_{i}', *p) for p in t.paths))
  return names


def is_fused(have: Collection[str]) -> bool:
  """Whether a checkpoint holding tensors `have` stores its experts fused."""
  return any(name.endswith(FUSED) for name in have)


# Qwen2-MoE and Qwen3-MoE: the keys both read the same way.

QWEN_KEYS = {'hidden_act', 'attention_dropout', 'use_sliding_window', 'sliding_window',
             'max_window_layers', 'layer_types', 'decoder_sparse_step', 'mlp_only_layers',
             'moe_intermediate_size', 'num_experts', 'num_local_experts', 'norm_topk_prob',
             *ROUTER_KEYS}


def _positive(hf: Mapping[str, Any], key: str) -> int:
  value = hf.get(key)
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise UserError(f'config.json {key}={value!r} is not a positive integer')
  return value


def qwen_moe_fields(hf: Mapping[str, Any], model_type: str) -> dict[str, Any]:
  """The fields Qwen2-MoE and Qwen3-MoE read alike: activation, full attention only, MoE in
  every `decoder_sparse_step`-th layer (layers step-1, 2·step-1, ...: paxlike's moe_every),
  experts of width `moe_intermediate_size` (dense layers: `intermediate_size`)."""
  hf_fields.refuse(hf, 'attention_dropout', (0, 0.0))
  hf_fields.refuse(hf, 'use_sliding_window', (False,))
  if hf.get('mlp_only_layers'):
    raise UserError(f'config.json mlp_only_layers={hf["mlp_only_layers"]!r} is not supported '
                    f'for model_type {model_type!r} (only [])')
  kinds = set(hf.get('layer_types') or ()) - {'full_attention'}
  if kinds:
    raise UserError(f'config.json layer_types holds {sorted(kinds)[0]!r}: only '
                    f"'full_attention' is supported for model_type {model_type!r}")
  step = _positive({'decoder_sparse_step': 1, **hf}, 'decoder_sparse_step')
  if step > hf['num_hidden_layers']:
    raise UserError(f'config.json decoder_sparse_step={step} leaves no MoE layer in '
                    f'num_hidden_layers={hf["num_hidden_layers"]}')
  key = 'num_experts' if 'num_experts' in hf else 'num_local_experts'
  width = _positive(hf, 'moe_intermediate_size')
  return {'mlp_activation': hf_fields.activation(hf), 'moe_every': step,
          'moe_d_ff': None if width == hf['intermediate_size'] else width,
          **router_fields(hf, key, renormalize=bool(hf.get('norm_topk_prob', False)))}


def qwen_moe_config(model: TransformerLM) -> dict[str, Any]:
  """The keys `qwen_moe_fields` reads, written for `model`."""
  return {'hidden_act': hf_fields.HF_ACTIVATION[model.mlp_activation or 'silu'],
          'attention_dropout': 0.0, 'use_sliding_window': False, 'sliding_window': None,
          'max_window_layers': model.num_layers, 'decoder_sparse_step': model.moe_every,
          'mlp_only_layers': [], 'moe_intermediate_size': model.moe_d_ff or model.d_ff,
          'num_experts': model.num_experts, 'norm_topk_prob': renormalizes(model),
          **router_config(model)}


def qwen_expert_names(model: TransformerLM, have: Collection[str] | None = None
                      ) -> dict[str, Tensor]:
  """A Qwen-MoE layer's router and experts: per-expert layout, or the fused one when the
  checkpoint tensors `have` are fused; plus the shared expert when `model` has one."""
  if have is not None and is_fused(have):
    names = fused_expert_names(model)
  else:
    names = expert_names(model, 'mlp', ('gate_proj', 'up_proj', 'down_proj'))
  return {**names, **shared_expert_names()} if model.moe_shared_d_ff else names
