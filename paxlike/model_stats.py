"""Parameter counts and training FLOPs of a model, from shapes only (nothing is allocated).

Training FLOPs per token of a `TransformerLM` (forward + backward = 3 × forward):

    6·N + 12·L·(n_heads·head_dim)·C

- N counts the parameters that take part in a matmul: per layer q, k, v, o
  (d·head_dim·(2·n_heads + 2·n_kv_heads)) and the MLP ((3 if gated else 2)·d·d_ff), plus the
  output projection (d·vocab; the tied embedding when tied). The input embedding lookup,
  position embedding and norm scales cost no matmul FLOPs and are left out.
- The attention term counts QKᵀ and AV: 2 matmuls × 2 FLOPs per multiply-add × n_heads·head_dim
  per attended key, per layer, × 3 for training. C is the mean number of keys a query attends:
  (T + 1)/2 for a causal mask over T tokens, fewer with a sliding window. (PaLM's 6N + 12·L·H·Q·T
  counts the masked half too; this counts only what a causal kernel has to compute.)
Elementwise work (norms, softmax, rope, activations) is not counted, as is usual for MFU.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from paxlike import throughput
from paxlike.errors import UserError
from paxlike.layers import TransformerLM
from paxlike.losses import LossFn


def abstract_params(model: nn.Module, seq_len: int = 8, sample: Any = None) -> Any:
  """The unboxed param tree as `ShapeDtypeStruct`s, via `jax.eval_shape` of `model.init`.

  The input is int32 tokens [1, seq_len] unless `sample` (an array or ShapeDtypeStruct tree,
  e.g. an image batch) is given.
  """
  if sample is None:
    sample = jax.ShapeDtypeStruct((1, seq_len), jnp.int32)
  variables = jax.eval_shape(model.init, jax.random.key(0), sample)
  return nn.unbox(variables)['params']


def param_count(model: nn.Module, seq_len: int = 8, sample: Any = None) -> int:
  """Number of parameters of `model` (shapes only; see `abstract_params` for the input)."""
  return sum(x.size for x in jax.tree.leaves(abstract_params(model, seq_len, sample)))


def attended_keys(seq_len: int, sliding_window: int | None = None) -> float:
  """Mean number of keys a query sees under a causal mask, optionally windowed."""
  window = seq_len if sliding_window is None else min(sliding_window, seq_len)
  # Query t (0-based) sees min(t + 1, window) keys.
  total = window * (window + 1) // 2 + (seq_len - window) * window
  return total / seq_len


def matmul_params(model: TransformerLM) -> int:
  """N in the formula: parameters used in matmuls (layers and output projection)."""
  head_dim = model.d_model // model.num_heads
  kv_heads = model.num_kv_heads or model.num_heads
  attn = model.d_model * head_dim * 2 * (model.num_heads + kv_heads)
  mlp = (3 if model.gated_mlp else 2) * model.d_model * model.d_ff
  return model.num_layers * (attn + mlp) + model.d_model * model.vocab_size


def flops_per_token(model: TransformerLM, seq_len: int) -> float:
  """Training FLOPs per token: 6·N + 12·L·(n_heads·head_dim)·C (see the module docstring)."""
  if not isinstance(model, TransformerLM):
    raise TypeError(f'flops_per_token needs a TransformerLM, got {type(model).__name__}; '
                    'use train_flops_per_example for other models')
  context = attended_keys(seq_len, model.sliding_window)
  attn_width = model.num_heads * (model.d_model // model.num_heads)
  return 6.0 * matmul_params(model) + 12.0 * model.num_layers * attn_width * context


def train_flops_per_example(model: nn.Module, sample: Any) -> float:
  """3 × XLA's FLOP count of one forward pass over `sample` (a batch of one), any model.

  XLA counts what the compiled graph does, including elementwise ops and, for attention, the
  masked half of the score matrix; use it for models without a closed formula (e.g. CNNs).
  """
  variables = jax.eval_shape(model.init, jax.random.key(0), sample)
  lowered = jax.jit(model.apply).lower(variables, sample)
  return 3.0 * float(lowered.cost_analysis()['flops'])



def gradient_flops(loss_fn: LossFn, params: Any, batch: dict) -> float | None:
  """XLA's FLOP count of one loss-and-gradient evaluation on `batch`, on one device."""
  rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
  grad_fn = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
  return throughput.step_flops_per_device(grad_fn.lower(params, batch, rng).compile())


def step_flops(model: nn.Module, loss_fn: LossFn, boxed_params: Any, batches: dict,
               num_devices: int) -> float | None:
  """Model FLOPs per device of one step on round `batches` [clients, local_steps, batch, ...]:
  6N + attention per token for a TransformerLM, else XLA's count of one micro-batch's gradient
  times clients × local steps (XLA counts a loop body only once); None where XLA has no count."""
  if isinstance(model, TransformerLM):
    tokens = batches['mask'].size
    return flops_per_token(model, batches['inputs'].shape[-1]) * tokens / num_devices
  flops = gradient_flops(loss_fn, nn.meta.unbox(boxed_params),
                         jax.tree.map(lambda x: x[0, 0], batches))
  return flops and flops * math.prod(batches['mask'].shape[:2]) / num_devices


def input_sample(data: Any) -> jax.ShapeDtypeStruct:
  """The abstract inputs of a batch of one from `data`: a token window or an example (image)."""
  if data.item == 'tokens':
    return jax.ShapeDtypeStruct((1, data.seq_len), jnp.int32)
  return jax.ShapeDtypeStruct((1, *data.image_shape), jnp.float32)


def kernel_line(model: nn.Module, data: Any) -> str:
  """`# attention kernel: NAME` for an LM (what 'auto' resolves to here), else ''. Raises
  UserError when the model forces a kernel this platform cannot run."""
  if not isinstance(model, TransformerLM):
    return ''
  return f'# attention kernel: {model.attention_kernel(data.seq_len)}\n'


def summary(model: nn.Module, data: Any) -> str:
  """`# params: ...`, training-FLOPs and attention-kernel lines for `--mode=print_config`.
  A model config its layers reject (at trace time) is a UserError, as in training."""
  try:
    return _summary(model, data)
  except (ValueError, TypeError) as error:
    raise UserError(f'invalid model config: {str(error).splitlines()[0]}') from None


def _summary(model: nn.Module, data: Any) -> str:
  if isinstance(model, TransformerLM):  # A closed FLOP formula (else XLA's count).
    seq_len = data.seq_len
    return (kernel_line(model, data) + f'# params: {param_count(model, seq_len):,}\n'
            f'# train FLOPs per token (seq_len {seq_len}): {flops_per_token(model, seq_len):.4g}\n')
  sample = input_sample(data)
  return (f'# params: {param_count(model, sample=sample):,}\n'
          f'# train FLOPs per example: {train_flops_per_example(model, sample):.4g}\n')
