"""Parameter counts and training FLOPs of a model, as its family computes them (from shapes
only; nothing is allocated). The formulas live with the families: the LM's closed form in
paxlike/families/lm_flops.py, XLA's count for other models in paxlike/families/shapes.py.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn

from paxlike.errors import UserError
from paxlike.families import family_of
# The formulas, under the names their callers (benchmarks, interop, tests) import from here.
from paxlike.families.lm_flops import attended_keys, flops_per_token, matmul_params
from paxlike.families.shapes import (abstract_params, gradient_flops, param_count,
                                     train_flops_per_example)
from paxlike.losses import LossFn

__all__ = ['abstract_params', 'attended_keys', 'flops_per_token', 'gradient_flops',
           'kernel_line', 'matmul_params', 'param_count', 'step_flops', 'summary',
           'train_flops_per_example']


def step_flops(model: nn.Module, loss_fn: LossFn, boxed_params: Any, batches: dict,
               num_devices: int) -> float | None:
  """Model FLOPs per device of one step on round `batches` [clients, local_steps, batch, ...]
  (the family's `step_flops`: 6N + attention per token for an LM, XLA's count otherwise)."""
  return family_of(model).step_flops(model, loss_fn, boxed_params, batches, num_devices)


def kernel_line(model: nn.Module, data: Any) -> str:
  """`# attention kernel: NAME` for a model that has one, else ''. Raises UserError when the
  model forces a kernel this platform cannot run."""
  return family_of(model).kernel_line(model, data)


def summary(model: nn.Module, data: Any) -> str:
  """`# params: ...`, training-FLOPs and attention-kernel lines for `--mode=print_config`.
  A model config its layers reject (at trace time) is a UserError, as in training."""
  try:
    return family_of(model).summary(model, data)
  except (ValueError, TypeError) as error:
    raise UserError(f'invalid model config: {str(error).splitlines()[0]}') from None
