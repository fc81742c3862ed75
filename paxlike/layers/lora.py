"""LoRA (Hu et al. 2021): low-rank adapters beside frozen kernels, and pure functions on params.

An adapted kernel W [in..., out...] (the attention's 'query', 'key', 'value', 'out'; the MLP's
'wi_gate', 'wi_up', 'wi', 'wo') gets two params beside it: `<name>_lora_a` [in..., r]
(LeCun-normal over the in axes) and `<name>_lora_b` [r, out...] (zeros, so an adapted model
starts equal to its base), named with W's logical axes plus a replicated 'lora_rank' axis. The
layer computes x @ W + (alpha / r) * (x @ A) @ B.

`merge_lora(params, model)` folds the adapters into the kernels (the plain model then gives the
same logits) and `lora_mask(params)` marks the adapter leaves, for training only them.

`LoraSpec.of(model)` is the one place that reads a model's LoRA fields (`lora_rank`,
`lora_alpha`, `lora_targets`): callers ask it whether the model has adapters (`enabled`), for
their mask, for the model with them off (`base`) and for the plain model and merged params
(`merged`), never the model itself.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

ATTENTION_TARGETS = ('query', 'key', 'value', 'out')
MLP_TARGETS = ('wi_gate', 'wi_up', 'wi', 'wo')
SUFFIXES = ('_lora_a', '_lora_b')
RANK_AXIS = 'lora_rank'


def check_targets(targets: Sequence[str], rank: int, gated_mlp: bool) -> None:
  """ValueError for a negative rank or a target that names no kernel of the model."""
  if rank < 0:
    raise ValueError(f'lora_rank must be >= 0 (0 = off), got {rank}')
  kernels = ATTENTION_TARGETS + (('wi_gate', 'wi_up', 'wo') if gated_mlp else ('wi', 'wo'))
  unknown = [t for t in targets if t not in kernels]
  if rank and (unknown or not targets):
    raise ValueError(f'lora_targets {tuple(targets)} name no kernel of this model '
                     f'({unknown or "none given"}); choose from {kernels}')


def adapter(module: nn.Module, name: str, x: jax.Array, in_shape: tuple[int, ...],
            out_shape: tuple[int, ...], in_names: tuple[str | None, ...],
            out_names: tuple[str | None, ...], rank: int, alpha: float, dtype: Any,
            param_dtype: Any) -> jax.Array:
  """(alpha / rank) * (x @ A) @ B for x [..., *in_shape] -> [..., *out_shape], declaring
  `<name>_lora_a` and `<name>_lora_b` in `module` (call it inside its compact method).
  ValueError when `rank` exceeds the projection's smaller side (a rank past it adds nothing)."""
  fan_in, fan_out = math.prod(in_shape), math.prod(out_shape)
  if rank > min(fan_in, fan_out):
    raise ValueError(f'lora_rank={rank} is larger than the {name} projection it adapts '
                     f'({fan_in} -> {fan_out}); use at most {min(fan_in, fan_out)}')
  in_axes = tuple(range(len(in_shape)))
  a_init = nn.initializers.lecun_normal(in_axis=in_axes, out_axis=-1)
  a = module.param(f'{name}_lora_a', nn.with_logical_partitioning(a_init, (*in_names, RANK_AXIS)),
                   (*in_shape, rank), param_dtype)
  b = module.param(f'{name}_lora_b',
                   nn.with_logical_partitioning(nn.initializers.zeros, (RANK_AXIS, *out_names)),
                   (rank, *out_shape), param_dtype)
  low = jnp.tensordot(x, jnp.asarray(a, dtype), axes=len(in_shape))
  return jnp.tensordot(low, jnp.asarray(b, dtype), axes=1) * jnp.asarray(alpha / rank, dtype)


def _is_adapter(name: Any) -> bool:
  return isinstance(name, str) and name.endswith(SUFFIXES)


def lora_mask(params: Any) -> Any:
  """A tree like `params` (boxed or not) of bools: True on the LoRA adapter leaves."""
  def mark(path: tuple[Any, ...], _: Any) -> bool:
    names = [p.key for p in path if isinstance(p, jax.tree_util.DictKey)]
    return bool(names) and _is_adapter(names[-1])
  return jax.tree_util.tree_map_with_path(mark, params)


def merged_kernel(kernel: jax.Array, a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
  """W + scale * A @ B, with A [*lead, *in, r] and B [*lead, r, *out] (lead: scanned layers)."""
  lead = a.ndim + b.ndim - 2 - kernel.ndim
  a2 = a.reshape(*a.shape[:lead], -1, a.shape[-1])
  b2 = b.reshape(*b.shape[:lead + 1], -1)
  delta = jnp.matmul(a2.astype(jnp.float32), b2.astype(jnp.float32)).reshape(kernel.shape)
  return (kernel.astype(jnp.float32) + scale * delta).astype(kernel.dtype)


def merge_lora(params: Any, model: nn.Module) -> Any:
  """`params` with every adapter pair folded into its kernel and removed: the same model with
  `lora_rank=0` then computes what `model` computes on `params`."""
  return _merged_tree(params, LoraSpec.of(model).scale)


def _merged_tree(params: Any, scale: float) -> Any:
  """`params` with each adapter pair folded into its kernel as W + scale * A @ B."""
  if not isinstance(params, dict):
    return params
  out = {k: _merged_tree(v, scale) for k, v in params.items() if not _is_adapter(k)}
  for name in {k[:-len('_lora_a')] for k in params if k.endswith('_lora_a')}:
    a, b = params[f'{name}_lora_a'], params[f'{name}_lora_b']
    if isinstance(out[name], dict):  # nn.Dense: {'kernel': W}.
      out[name] = {**out[name], 'kernel': merged_kernel(out[name]['kernel'], a, b, scale)}
    else:
      out[name] = merged_kernel(out[name], a, b, scale)
  return out


@dataclasses.dataclass(frozen=True)
class LoraSpec:
  """A model's LoRA adapters as its fields set them: `rank` 0 (or no such field) is none."""

  rank: int = 0
  alpha: float = 0.0
  targets: tuple[str, ...] = ()

  @classmethod
  def of(cls, model: Any) -> LoraSpec:
    """The spec `model` (a module or anything with its fields) declares."""
    return cls(getattr(model, 'lora_rank', 0), getattr(model, 'lora_alpha', 0.0),
               tuple(getattr(model, 'lora_targets', ())))

  @property
  def enabled(self) -> bool:
    """Whether the model has adapters."""
    return bool(self.rank)

  @property
  def scale(self) -> float:
    """alpha / rank, the adapters' factor (0.0 without adapters)."""
    return self.alpha / self.rank if self.enabled else 0.0

  @property
  def mask(self) -> Callable[[Any], Any] | None:
    """`lora_mask` (train the adapters alone) with adapters, else None (train every leaf)."""
    return lora_mask if self.enabled else None

  def copies_reference(self, needs_reference: bool) -> bool:
    """Whether a loss that `needs_reference` (DPO, IPO) makes the trainer keep a frozen copy of
    the params: without adapters it must; with them the reference is the model, adapters off."""
    return needs_reference and not self.enabled

  def base(self, model: nn.Module) -> nn.Module:
    """`model` with its adapters off (`lora_rank=0`); `model` itself without adapters."""
    return model.clone(lora_rank=0) if self.enabled else model

  def merged(self, model: nn.Module, params: Any) -> tuple[nn.Module, Any]:
    """(the plain model, `params` with the adapters folded into their kernels), which compute
    what `model` computes on `params`; (`model`, `params`) unchanged without adapters."""
    if not self.enabled:
      return model, params
    return self.base(model), _merged_tree(params, self.scale)
