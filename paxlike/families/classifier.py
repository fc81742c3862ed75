"""The classifier family (the vision classifiers, and any model of examples → class logits):
example items, XLA's FLOP count, a prior-mixed ensemble; no decoding, no memory estimate."""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from paxlike.federated.ensemble import mixture_log_probs
from paxlike.families.base import Family, check_item, mask_items
from paxlike.families.shapes import gradient_flops, param_count, train_flops_per_example
from paxlike.core.loss import LossFn


def step_flops(model: nn.Module, loss_fn: LossFn, boxed_params: Any, batches: dict,
               num_devices: int) -> float | None:
  """XLA's count of one micro-batch's gradient × clients × local steps (XLA counts a loop body
  only once), per device; None where XLA has no count."""
  del model
  flops = gradient_flops(loss_fn, nn.meta.unbox(boxed_params),
                         jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[2:], x.dtype),
                                      batches))
  return flops and flops * math.prod(batches['mask'].shape[:2]) / num_devices


def input_sample(data: Any) -> jax.ShapeDtypeStruct:
  """An example of one: float32 [1, *image_shape]."""
  return jax.ShapeDtypeStruct((1, *data.image_shape), jnp.float32)


def summary(model: nn.Module, data: Any) -> str:
  """Params and XLA's training FLOPs per example."""
  sample = input_sample(data)
  return (f'# params: {param_count(model, sample=sample):,}\n'
          f'# train FLOPs per example: {train_flops_per_example(model, sample):.4g}\n')


def complete(model: nn.Module, data: Any) -> nn.Module:
  """Classifiers take nothing from their data."""
  del data
  return model


def check_data(model: nn.Module, data: Any) -> None:
  """Example data."""
  check_item(FAMILY, model, data)


def no_kernel(model: nn.Module, data: Any) -> str:
  del model, data
  return ''


def no_memory_estimate(task: Any) -> str:
  del task
  return ''


def unchanged(model_config: Any) -> None:
  """Classifiers are small already."""
  del model_config


FAMILY = Family(
    name='classifier', item='examples', can_decode=False, complete=complete,
    check_data=check_data,
    items_per_step=mask_items, step_flops=step_flops, input_sample=input_sample,
    summary=summary, kernel_line=no_kernel, memory_summary=no_memory_estimate,
    mix_ensemble=mixture_log_probs, shrink=unchanged)
