"""Training a part of the params (LoRA's adapters): the mask that marks it, and the split of the
params into that part and the frozen rest, and back."""

from __future__ import annotations

from typing import Any, Callable

from flax import traverse_util

# params -> a tree of bools shaped like them: True on the leaves that are trained.
TrainableMask = Callable[[Any], Any]


def split_params(params: Any, trainable: TrainableMask | None) -> tuple[Any, Any]:
  """(trainable, frozen): two nested dicts holding the leaves of `params` that `trainable`
  marks True and the rest; without a mask, (params, None)."""
  if trainable is None:
    return params, None
  flat = traverse_util.flatten_dict(params)
  mask = traverse_util.flatten_dict(trainable(params))
  pick = lambda keep: traverse_util.unflatten_dict({k: v for k, v in flat.items()
                                                    if bool(mask[k]) == keep})
  return pick(True), pick(False)


def merge_params(trainable: Any, frozen: Any) -> Any:
  """The params `split_params` split into (trainable, frozen)."""
  if frozen is None:
    return trainable
  return traverse_util.unflatten_dict({**traverse_util.flatten_dict(frozen),
                                       **traverse_util.flatten_dict(trainable)})
