"""RMSNorm with a weight offset: y = x / rms(x) · (offset + w), computed in float32.

offset 0 is flax's `nn.RMSNorm` (w starts at 1); Gemma's norms use offset 1 (w starts at 0,
so a fresh model's norms are the identity scale, as Gemma's checkpoints store them).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

DType = Any


class OffsetRMSNorm(nn.Module):
  """RMSNorm over the last axis with scale (offset + w); param 'scale' named (`axis_name`,)."""

  offset: float = 1.0
  epsilon: float = 1e-6
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32
  axis_name: str = 'embed'

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    init = nn.with_logical_partitioning(nn.initializers.constant(1.0 - self.offset),
                                        (self.axis_name,))
    w = self.param('scale', init, (x.shape[-1],), self.param_dtype)
    x32 = jnp.asarray(x, jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.epsilon)
    return (y * (self.offset + jnp.asarray(w, jnp.float32))).astype(self.dtype)


def rms_norm(dtype: DType, param_dtype: DType, name: str, eps: float = 1e-6,
             offset: float = 0.0, axis_name: str = 'embed') -> nn.Module:
  """An RMSNorm named `name`: flax's at offset 0, else `OffsetRMSNorm`."""
  if offset:
    return OffsetRMSNorm(offset, eps, dtype, param_dtype, axis_name, name=name)
  scale_init = nn.with_logical_partitioning(nn.initializers.ones, (axis_name,))
  return nn.RMSNorm(epsilon=eps, scale_init=scale_init, dtype=dtype, param_dtype=param_dtype,
                    name=name)
