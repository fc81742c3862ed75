"""Small image classifiers (MLP and the FedAvg CNN) with logical axis annotations.

They use the LM's logical names, so one rule table covers every model:
hidden features are 'mlp', the features they read are 'embed', and spatial
kernel dims are None. The class dim is None too (replicated): 10 classes would
not divide a 4- or 8-way 'vocab' sharding, and jax rejects uneven shardings.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

DType = Any
Names = tuple[str | None, ...]


def _dense(features: int, names: Names, dtype: DType, name: str) -> nn.Dense:
  """A Dense layer whose kernel is named `names` and bias names[1:]."""
  return nn.Dense(
      features,
      kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), names),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros, names[1:]),
      dtype=dtype,
      name=name,
  )


class MlpClassifier(nn.Module):
  """Images float[B, H, W(, C)] -> flatten -> ReLU MLP -> logits float32[B, num_classes]."""

  num_classes: int = 10
  hidden: tuple[int, ...] = (128,)
  dropout_rate: float = 0.0
  dtype: DType = jnp.float32

  @nn.compact
  def __call__(self, images: jax.Array, *, deterministic: bool = True) -> jax.Array:
    x = images.reshape(images.shape[0], -1).astype(self.dtype)
    for i, width in enumerate(self.hidden):
      x = nn.relu(_dense(width, ('embed', 'mlp'), self.dtype, f'hidden_{i}')(x))
      x = nn.with_logical_constraint(x, ('batch', 'mlp'))
      x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    in_name = 'mlp' if self.hidden else 'embed'
    logits = _dense(self.num_classes, (in_name, None), self.dtype, 'head')(x)
    return logits.astype(jnp.float32)


class CnnClassifier(nn.Module):
  """The FedAvg CNN (McMahan et al. 2017) for 28x28 images.

  Two 5x5 SAME convolutions with `features` channels, each ReLU + 2x2 max
  pool, a ReLU dense layer of `dense` units, then a linear head. With the
  defaults on [B, 28, 28, 1] this is the paper's 1,663,370-parameter model.
  Inputs [B, H, W] are treated as one channel.
  """

  num_classes: int = 10
  features: tuple[int, int] = (32, 64)
  dense: int = 512
  dropout_rate: float = 0.0
  dtype: DType = jnp.float32

  @nn.compact
  def __call__(self, images: jax.Array, *, deterministic: bool = True) -> jax.Array:
    x = images[..., None] if images.ndim == 3 else images
    x = x.astype(self.dtype)
    for i, channels in enumerate(self.features):
      x = nn.Conv(
          channels,
          kernel_size=(5, 5),
          padding='SAME',
          kernel_init=nn.with_logical_partitioning(
              nn.initializers.lecun_normal(), (None, None, 'embed', 'mlp')
          ),
          bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ('mlp',)),
          dtype=self.dtype,
          name=f'conv_{i}',
      )(x)
      x = nn.max_pool(nn.relu(x), window_shape=(2, 2), strides=(2, 2), padding='SAME')
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(_dense(self.dense, ('embed', 'mlp'), self.dtype, 'dense')(x))
    x = nn.with_logical_constraint(x, ('batch', 'mlp'))
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    logits = _dense(self.num_classes, ('mlp', None), self.dtype, 'head')(x)
    return logits.astype(jnp.float32)
