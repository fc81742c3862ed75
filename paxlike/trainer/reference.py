"""The reference model of a full fine-tune's DPO or IPO: a frozen copy of the initial params,
kept in the params tree under REFERENCE.

A LoRA model needs no copy (its reference is the base with the adapters off). Without LoRA the
reference is the run's params at step 0 (its init, or what `train.init_from` imported), copied
once into `params[REFERENCE]` and never trained: the trainer's trainable mask (`policy_mask`)
leaves it out of the gradient and the optimizer state, as LoRA's frozen base is. So it is
sharded like the params (the same logical axes), saved in every checkpoint and restored
bitwise on resume, and in a federated round it stays where it is (only trained leaves travel).

Why a frozen copy and not reference log-probabilities computed once over the data before step
1 and stored in the job dir (TRL's `precompute_ref_log_probs`): the copy works with any data
order, any number of epochs, held-out pairs and federated clients alike, needs no pass over
the data before training and no file to keep in step with the data, and is exact on resume by
construction. Its cost is one more params-sized buffer per device (counted by the memory
estimate of `--mode=print_config`) and one forward pass per step, which precomputation would
save; the forward pass is the same one the LoRA reference costs.
"""

from __future__ import annotations

from typing import Any

import jax

from paxlike.layers.lora import LoraSpec
from paxlike.trainer.preference_loss import PreferenceLoss

REFERENCE = 'frozen_reference'  # The params key of the copy (no model names a layer so).
PREFIX = REFERENCE + '/'        # Its leaves' names in a flattened ('a/b/kernel') params dict.


def needs_copy(model: Any, loss: PreferenceLoss) -> bool:
  """Whether preference `loss` on `model` needs a frozen copy of the params: a kind with a
  reference (dpo, ipo) on a model without LoRA adapters (the preference objective's
  `reference_copy`, objectives/preference.py)."""
  return LoraSpec.of(model).copies_reference(loss.needs_reference)


def attach(params: dict[str, Any]) -> dict[str, Any]:
  """`params` with a copy of themselves under REFERENCE (abstract or boxed params alike)."""
  return {**params, REFERENCE: params}


def has_copy(params: Any) -> bool:
  return isinstance(params, dict) and REFERENCE in params


def policy(params: Any) -> Any:
  """`params` without the frozen copy (unchanged when they hold none): the model's params."""
  if not has_copy(params):
    return params
  return {k: v for k, v in params.items() if k != REFERENCE}


def frozen(params: dict[str, Any]) -> Any:
  """The frozen copy in `params`, with no gradient through it."""
  return jax.lax.stop_gradient(params[REFERENCE])


def policy_mask(params: Any) -> Any:
  """A tree like `params` of bools (a core.trainable.TrainableMask): False on the copy's
  leaves, True on every other one."""
  def mark(path: tuple[Any, ...], _: Any) -> bool:
    return not (path and getattr(path[0], 'key', None) == REFERENCE)
  return jax.tree_util.tree_map_with_path(mark, params)


def without_copy_names(flat: dict[str, Any]) -> dict[str, Any]:
  """A flattened ('a/b/kernel' -> value) params dict without the copy's entries."""
  return {k: v for k, v in flat.items() if not k.startswith(PREFIX)}
