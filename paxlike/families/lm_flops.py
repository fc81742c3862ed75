"""Training FLOPs of a `TransformerLM`, from its fields (closed form).

Training FLOPs per token (forward + backward = 3 × forward):

    6·N + 12·L·(n_heads·head_dim)·C

- N counts the parameters that take part in a matmul: per layer q, k, v, o
  (d·head_dim·(2·n_heads + 2·n_kv_heads)) and the MLP ((3 if gated else 2)·d·d_ff), plus the
  output projection (d·vocab; the tied embedding when tied). The input embedding lookup,
  position embedding and norm scales cost no matmul FLOPs and are left out. A MoE layer's MLP
  counts only the experts a token is routed to (experts_per_token × the expert MLP of width
  moe_d_ff) plus its router (d·E), and a shared expert (Qwen2-MoE) with its gate when it has
  one; capacity slack, dropped tokens and the dispatch/combine einsums are not counted, so MFU
  is that of the active parameters, as is usual for MoE.
- The attention term counts QKᵀ and AV: 2 matmuls × 2 FLOPs per multiply-add × n_heads·head_dim
  per attended key, per layer, × 3 for training. C is the mean number of keys a query attends:
  (T + 1)/2 for a causal mask over T tokens, fewer with a sliding window (averaged over the
  layers when only the local ones have it, `mean_attended_keys`). head_dim is the model's
  (`head_size()`, which may differ from d/n_heads); biases are not counted. (PaLM's 6N + 12·L·H·Q·T
  counts the masked half too; this counts only what a causal kernel has to compute.)
Elementwise work (norms, softmax, rope, activations) is not counted, as is usual for MFU.
"""

from __future__ import annotations

from paxlike.layers import TransformerLM


def attended_keys(seq_len: int, sliding_window: int | None = None) -> float:
  """Mean number of keys a query sees under a causal mask, optionally windowed."""
  window = seq_len if sliding_window is None else min(sliding_window, seq_len)
  # Query t (0-based) sees min(t + 1, window) keys.
  total = window * (window + 1) // 2 + (seq_len - window) * window
  return total / seq_len


def mean_attended_keys(model: TransformerLM, seq_len: int) -> float:
  """`attended_keys` averaged over the layers (local layers windowed, global ones not)."""
  return sum(attended_keys(seq_len, model.sliding_window if model.is_local_layer(i) else None)
             for i in range(model.num_layers)) / model.num_layers


def matmul_params(model: TransformerLM) -> int:
  """N in the formula: parameters used in matmuls (layers and output projection)."""
  head_dim = model.head_size()
  kv_heads = model.num_kv_heads or model.num_heads
  attn = model.d_model * head_dim * 2 * (model.num_heads + kv_heads)
  per_width = (3 if model.gated_mlp else 2) * model.d_model
  mlp = per_width * model.d_ff
  moe_layers = sum(map(model.is_moe_layer, range(model.num_layers)))
  shared = (per_width * model.moe_shared_d_ff + model.d_model) if model.moe_shared_d_ff else 0
  active_moe = (model.experts_per_token * per_width * (model.moe_d_ff or model.d_ff)
                + model.d_model * model.num_experts + shared)
  return (model.num_layers * attn + (model.num_layers - moe_layers) * mlp
          + moe_layers * active_moe + model.d_model * model.vocab_size)


def flops_per_token(model: TransformerLM, seq_len: int) -> float:
  """Training FLOPs per token: 6·N + 12·L·(n_heads·head_dim)·C (see the module docstring)."""
  if not isinstance(model, TransformerLM):
    raise TypeError(f'flops_per_token needs a TransformerLM, got {type(model).__name__}; '
                    'use train_flops_per_example for other models')
  context = mean_attended_keys(model, seq_len)
  attn_width = model.num_heads * model.head_size()
  return 6.0 * matmul_params(model) + 12.0 * model.num_layers * attn_width * context
