"""Decoder-only transformer language model with logical axis annotations."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from paxlike.layers.attention import CausalSelfAttention

DType = Any

EMBED_ACT = ('batch', 'length', 'embed')
MLP_ACT = ('batch', 'length', 'mlp')
VOCAB_ACT = ('batch', 'length', 'vocab')


def make_norm(use_rmsnorm: bool, dtype: DType, param_dtype: DType, name: str) -> nn.Module:
  """RMSNorm (scale only) or LayerNorm (scale and bias), params named ('embed',)."""
  scale_init = nn.with_logical_partitioning(nn.initializers.ones, ('embed',))
  if use_rmsnorm:
    return nn.RMSNorm(scale_init=scale_init, dtype=dtype, param_dtype=param_dtype, name=name)
  bias_init = nn.with_logical_partitioning(nn.initializers.zeros, ('embed',))
  return nn.LayerNorm(
      scale_init=scale_init, bias_init=bias_init, dtype=dtype, param_dtype=param_dtype, name=name
  )


class Mlp(nn.Module):
  """Feed-forward block: SwiGLU (gated) or GELU, without biases."""

  d_ff: int
  gated: bool = True
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32

  def _dense(self, x: jax.Array, features: int, names: tuple[str, str], name: str) -> jax.Array:
    kernel_init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), names)
    return nn.Dense(
        features,
        use_bias=False,
        kernel_init=kernel_init,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name=name,
    )(x)

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x: [B, T, embed] -> [B, T, embed]."""
    if self.gated:
      h = nn.silu(self._dense(x, self.d_ff, ('embed', 'mlp'), 'wi_gate'))
      h = h * self._dense(x, self.d_ff, ('embed', 'mlp'), 'wi_up')
    else:
      h = nn.gelu(self._dense(x, self.d_ff, ('embed', 'mlp'), 'wi'))
    h = nn.with_logical_constraint(h, MLP_ACT)
    return self._dense(h, x.shape[-1], ('mlp', 'embed'), 'wo')


class DecoderBlock(nn.Module):
  """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

  attention: CausalSelfAttention
  d_ff: int
  gated_mlp: bool = True
  use_rmsnorm: bool = True
  dropout_rate: float = 0.0
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    """x: [B, T, embed] -> [B, T, embed]."""
    h = make_norm(self.use_rmsnorm, self.dtype, self.param_dtype, 'attn_norm')(x)
    h = self.attention(h)
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    x = nn.with_logical_constraint(x + h, EMBED_ACT)
    h = make_norm(self.use_rmsnorm, self.dtype, self.param_dtype, 'mlp_norm')(x)
    h = Mlp(self.d_ff, self.gated_mlp, self.dtype, self.param_dtype, name='mlp')(h)
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    return nn.with_logical_constraint(x + h, EMBED_ACT)


class TransformerLM(nn.Module):
  """Decoder-only LM: tokens int32[B, T] -> logits float32[B, T, vocab_size].

  `num_kv_heads=None` means num_heads (plain multi-head attention); fewer
  gives grouped-query attention. `rope=False` adds a learned absolute position
  embedding of `max_len` rows (then T <= max_len); with rope there is no
  position parameter and `max_len` is unused. `sliding_window=W` lets each
  token attend to itself and the W - 1 previous tokens. `dtype` is the compute
  dtype; logits are always float32.
  """

  vocab_size: int = 256
  num_layers: int = 2
  d_model: int = 128
  num_heads: int = 4
  num_kv_heads: int | None = None
  d_ff: int = 512
  max_len: int = 256
  tied_embeddings: bool = True
  use_rmsnorm: bool = True
  gated_mlp: bool = True
  rope: bool = True
  rope_base: float = 10_000.0
  dropout_rate: float = 0.0
  sliding_window: int | None = None
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32

  def _check(self, seq_len: int) -> None:
    if self.d_model % self.num_heads:
      raise ValueError(f'd_model={self.d_model} is not a multiple of num_heads={self.num_heads}')
    if self.rope and (self.d_model // self.num_heads) % 2:
      raise ValueError(f'rope needs an even head dim, got {self.d_model // self.num_heads}')
    if not self.rope and seq_len > self.max_len:
      raise ValueError(f'sequence length {seq_len} exceeds max_len={self.max_len}')

  def _block(self, i: int) -> DecoderBlock:
    """Layer i. The unbound (parent=None) attention is adopted by the block as 'attention'."""
    attention = CausalSelfAttention(
        num_heads=self.num_heads,
        num_kv_heads=self.num_kv_heads or self.num_heads,
        head_dim=self.d_model // self.num_heads,
        rope=self.rope,
        rope_base=self.rope_base,
        sliding_window=self.sliding_window,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        parent=None,
    )
    return DecoderBlock(
        attention,
        d_ff=self.d_ff,
        gated_mlp=self.gated_mlp,
        use_rmsnorm=self.use_rmsnorm,
        dropout_rate=self.dropout_rate,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name=f'block_{i}',
    )

  @nn.compact
  def __call__(self, tokens: jax.Array, *, deterministic: bool = True) -> jax.Array:
    """tokens int32[B, T] -> logits float32[B, T, vocab_size]; dropout iff not deterministic."""
    self._check(tokens.shape[1])
    embed_init = nn.initializers.normal(stddev=self.d_model**-0.5)
    embed = nn.Embed(
        self.vocab_size,
        self.d_model,
        embedding_init=nn.with_logical_partitioning(embed_init, ('vocab', 'embed')),
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name='embed',
    )
    x = embed(tokens)
    if not self.rope:
      pos_init = nn.with_logical_partitioning(embed_init, (None, 'embed'))
      pos = self.param('pos_embed', pos_init, (self.max_len, self.d_model), self.param_dtype)
      x = x + jnp.asarray(pos[: tokens.shape[1]], self.dtype)[None]
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    x = nn.with_logical_constraint(x, EMBED_ACT)
    for i in range(self.num_layers):
      x = self._block(i)(x, deterministic)
    x = make_norm(self.use_rmsnorm, self.dtype, self.param_dtype, 'final_norm')(x)
    if self.tied_embeddings:
      logits = embed.attend(x)
    else:
      head_init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('embed', 'vocab'))
      logits = nn.Dense(
          self.vocab_size,
          use_bias=False,
          kernel_init=head_init,
          dtype=self.dtype,
          param_dtype=self.param_dtype,
          name='lm_head',
      )(x)
    return nn.with_logical_constraint(logits.astype(jnp.float32), VOCAB_ACT)
