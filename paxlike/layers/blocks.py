"""The pieces of a decoder layer: norms, the feed-forward block and the pre-norm residual block."""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from paxlike.layers import lora, quantization
from paxlike.layers.attention import CausalSelfAttention
from paxlike.layers.norms import rms_norm

DType = Any

EMBED_ACT = ('batch', 'length', 'embed')
MLP_ACT = ('batch', 'length', 'mlp')
# 'gelu' is flax's default (the tanh approximation); 'gelu_tanh' says so, 'gelu_exact' is erf's.
MLP_ACTIVATIONS = {'silu': nn.silu, 'gelu': nn.gelu,
                   'gelu_tanh': functools.partial(nn.gelu, approximate=True),
                   'gelu_exact': functools.partial(nn.gelu, approximate=False)}


def make_norm(use_rmsnorm: bool, dtype: DType, param_dtype: DType, name: str,
              eps: float = 1e-6, offset: float = 0.0) -> nn.Module:
  """RMSNorm (scale only, weight `offset`: see `norms`) or LayerNorm (scale and bias), params
  named ('embed',)."""
  scale_init = nn.with_logical_partitioning(nn.initializers.ones, ('embed',))
  if use_rmsnorm:
    return rms_norm(dtype, param_dtype, name, eps, offset)
  bias_init = nn.with_logical_partitioning(nn.initializers.zeros, ('embed',))
  return nn.LayerNorm(epsilon=eps, scale_init=scale_init, bias_init=bias_init, dtype=dtype,
                      param_dtype=param_dtype, name=name)


class Mlp(nn.Module):
  """Feed-forward block without biases: gated (SwiGLU with 'silu', GeGLU with 'gelu') or plain.

  With `lora_rank` > 0, each kernel named in `lora_targets` gets LoRA adapters (see `lora`).
  """

  d_ff: int
  gated: bool = True
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32
  activation: str = 'silu'
  lora_rank: int = 0
  lora_alpha: float = 16.0
  lora_targets: tuple[str, ...] = ()
  base_quantization: str = 'none'  # 'int8' or 'nf4': frozen kernels (see `quantization`).
  double_quant: bool = True

  def _dense(self, x: jax.Array, features: int, names: tuple[str, str], name: str) -> jax.Array:
    if self.base_quantization != 'none':  # Frozen, stored quantized: same 'kernel' path.
      kernel = quantization.QuantKernel((x.shape[-1], features), names, self.base_quantization,
                                        self.double_quant, self.dtype, name=name)()
      y = jnp.asarray(x, self.dtype) @ kernel
    else:
      kernel_init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), names)
      y = nn.Dense(
          features,
          use_bias=False,
          kernel_init=kernel_init,
          dtype=self.dtype,
          param_dtype=self.param_dtype,
          name=name,
      )(x)
    if self.lora_rank and name in self.lora_targets:
      y = y + lora.adapter(self, name, jnp.asarray(x, self.dtype), (x.shape[-1],), (features,),
                           names[:1], names[1:], self.lora_rank, self.lora_alpha, self.dtype,
                           self.param_dtype)
    return y

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x: [B, T, embed] -> [B, T, embed]."""
    act = MLP_ACTIVATIONS[self.activation]
    if self.gated:
      h = act(self._dense(x, self.d_ff, ('embed', 'mlp'), 'wi_gate'))
      h = h * self._dense(x, self.d_ff, ('embed', 'mlp'), 'wi_up')
    else:
      h = act(self._dense(x, self.d_ff, ('embed', 'mlp'), 'wi'))
    h = nn.with_logical_constraint(h, MLP_ACT)
    return self._dense(h, x.shape[-1], ('mlp', 'embed'), 'wo')


class DecoderBlock(nn.Module):
  """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x)); with `sandwich_norm`
  (Gemma 2/3) each branch's output is normed too before the residual add ('post_attn_norm',
  'post_mlp_norm'). Every norm's weight offset is `norm_weight_offset`.

  `mlp`, when given, is an unbound feed-forward block (e.g. `moe.MoeMlp`) adopted as 'mlp';
  None builds the dense `Mlp` from the fields.
  """

  attention: CausalSelfAttention
  d_ff: int
  gated_mlp: bool = True
  use_rmsnorm: bool = True
  dropout_rate: float = 0.0
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32
  mlp_activation: str = 'silu'
  norm_eps: float = 1e-6
  lora_rank: int = 0
  lora_alpha: float = 16.0
  lora_targets: tuple[str, ...] = ()
  mlp: nn.Module | None = None
  sandwich_norm: bool = False
  norm_weight_offset: float = 0.0
  base_quantization: str = 'none'
  double_quant: bool = True

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool, decode: bool = False,
               cache_len: int | None = None, segment_ids: jax.Array | None = None,
               positions: jax.Array | None = None, local: jax.Array | None = None) -> jax.Array:
    """x: [B, T, embed] -> [B, T, embed]; the rest goes to the attention."""
    norm = lambda name: make_norm(self.use_rmsnorm, self.dtype, self.param_dtype, name,
                                  self.norm_eps, self.norm_weight_offset)
    h = self.attention(norm('attn_norm')(x), segment_ids, positions, decode, cache_len, local)
    if self.sandwich_norm:
      h = norm('post_attn_norm')(h)
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    x = nn.with_logical_constraint(x + h, EMBED_ACT)
    mlp = self.mlp if self.mlp is not None else Mlp(
        self.d_ff, self.gated_mlp, self.dtype, self.param_dtype, self.mlp_activation,
        self.lora_rank, self.lora_alpha, self.lora_targets, self.base_quantization,
        self.double_quant, name='mlp')
    h = mlp(norm('mlp_norm')(x))
    if self.sandwich_norm:
      h = norm('post_mlp_norm')(h)
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    return nn.with_logical_constraint(x + h, EMBED_ACT)
