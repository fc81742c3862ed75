"""The model-family features of a `TransformerLM` (biases, head_dim, RoPE scaling, local and
global layers, Gemma's norms, scales and soft-caps): their checks, and which layer is which.

Local/global layers: with `global_every=k` > 0 every k-th layer (k-1, 2k-1, ...) is global
and the rest local; local layers attend within `sliding_window` and use `local_rope_base`
(unscaled) when it is set. Unrolled, each layer is built with its kind; scanned, a stack of
mixed kinds takes the kinds as scanned inputs (`scanned_local_flags`), so one scanned layer
picks its window and RoPE per step.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from paxlike.layers.rope import RopeScaling


def _positive(model: Any, name: str) -> None:
  value = getattr(model, name)
  if value is not None and not value > 0:
    raise ValueError(f'{name} must be None or positive, got {value}')


def check(model: Any) -> None:
  """ValueErrors for feature fields that cannot run."""
  for name in ('head_dim', 'sliding_window', 'local_rope_base', 'query_scale',
               'attn_logit_softcap', 'final_logit_softcap'):
    _positive(model, name)
  if not isinstance(model.global_every, int) or model.global_every < 0:
    raise ValueError(f'global_every must be an int >= 0 (0: no global layers), '
                     f'got {model.global_every!r}')
  if model.global_every and model.sliding_window is None and model.local_rope_base is None:
    raise ValueError(f'global_every={model.global_every} needs a sliding_window or a '
                     'local_rope_base to tell local layers from global ones')
  scaling = model.rope_scaling
  if scaling is not None and not isinstance(scaling, RopeScaling):
    raise ValueError(f'rope_scaling must be a paxlike.layers.rope.RopeScaling, got {scaling!r}')
  half = model.head_size() // 2
  if scaling is not None and scaling.kind == 'longrope' and not (
      len(scaling.short_factor) == len(scaling.long_factor) == half):
    raise ValueError(f'longrope short_factor and long_factor need head_dim / 2 = {half} values')


def is_local_layer(model: Any, layer: int) -> bool:
  """Whether layer `layer` (0-based) is local (see the module docstring)."""
  return not (model.global_every and (layer + 1) % model.global_every == 0)


def mixed_layers(model: Any) -> bool:
  """Whether the layers differ: some local, some global, and local ones differ."""
  kinds = {is_local_layer(model, i) for i in range(model.num_layers)}
  return len(kinds) > 1 and (model.sliding_window is not None
                             or model.local_rope_base is not None)


def scanned_local_flags(model: Any, group: int = 1) -> jnp.ndarray | None:
  """bool [num_layers // group] (or [.., group] for grouped steps) of each scanned step's
  layer kinds; None when every layer is alike."""
  if not mixed_layers(model):
    return None
  flags = np.asarray([is_local_layer(model, i) for i in range(model.num_layers)])
  steps = model.num_layers // group
  return jnp.asarray(flags.reshape(steps, group) if group > 1 else flags)


def attention_fields(model: Any, is_local: bool) -> dict[str, Any]:
  """The `CausalSelfAttention` fields the features set, for a layer of kind `is_local`."""
  return dict(rope_scaling=model.rope_scaling, local_rope_base=model.local_rope_base,
              is_local=is_local, qkv_bias=model.qkv_bias, out_bias=model.out_bias,
              query_scale=model.query_scale, attn_logit_softcap=model.attn_logit_softcap,
              norm_weight_offset=model.norm_weight_offset)
