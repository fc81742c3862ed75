"""Parameter counts and XLA's FLOP counts of any model, from shapes only (nothing is allocated)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from paxlike.core.loss import LossFn


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
  return step_flops_per_device(grad_fn.lower(params, batch, rng).compile())


def step_flops_per_device(compiled: Any) -> float | None:
  """FLOPs of one step on one device (XLA's cost analysis of the partitioned program)."""
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else {}
  flops = (analysis or {}).get('flops')
  return float(flops) if flops and flops > 0 else None
