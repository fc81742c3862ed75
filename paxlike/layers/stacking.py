"""Unrolled ('block_{i}') and scanned ('blocks', stacked on a leading 'layers' axis) params of
a `TransformerLM`, one from the other, and which of the two a decode runs on
(`decode_layout`)."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from paxlike.layers import lm_features


def stack_layers(params: dict[str, Any], num_layers: int, group: int = 1) -> dict[str, Any]:
  """Unrolled params ('block_{i}') -> scanned params ('blocks', leaves stacked on axis 0); with
  `group` > 1 (a MoE model's moe_every), 'blocks/layer_{j}' stacks layers j, j + group, ..."""
  rest = {k: v for k, v in params.items() if not k.startswith('block_')}
  stack = lambda *xs: np.stack(xs) if isinstance(xs[0], np.ndarray) else jnp.stack(xs)
  stacked = lambda layers: jax.tree.map(stack, *[params[f'block_{i}'] for i in layers])
  if group == 1:
    return {**rest, 'blocks': stacked(range(num_layers))}
  return {**rest, 'blocks': {f'layer_{j}': stacked(range(j, num_layers, group))
                             for j in range(group)}}


def unstack_layers(params: dict[str, Any]) -> dict[str, Any]:
  """Scanned params ('blocks', grouped or not) -> unrolled params ('block_{i}')."""
  rest = {k: v for k, v in params.items() if k != 'blocks'}
  blocks = params['blocks']
  groups = [blocks] if 'layer_0' not in blocks else [blocks[f'layer_{j}']
                                                     for j in range(len(blocks))]
  steps = jax.tree.leaves(blocks)[0].shape[0]
  layers = {f'block_{s * len(groups) + j}': jax.tree.map(lambda x, s=s: x[s], tree)
            for s in range(steps) for j, tree in enumerate(groups)}
  return {**rest, **layers}


def decode_layout(model: Any, params: dict[str, Any], cache_size: int, rows: int,
                  stats_of: Callable[[Any], dict[str, int] | None] = lambda d: d.memory_stats()
                  ) -> tuple[Any, dict[str, Any]]:
  """(model, params) to decode `rows` rows with a cache of `cache_size` slots.

  A scanned stack with `decode_layers='unrolled'` (the default) is unrolled, its params split
  per layer by one program (a copy: the caller's stacked ones stay), where every device holding
  them has room for the copy by `stats_of` (a device's memory stats; CPU reports none and
  always has room); where one has not, it decodes as with 'scan'. With 'scan', a stack of local
  and global layers is unrolled only where that saves memory: so that each layer's cache is
  sized by its own kind (a local layer's ring holds only its window, see `kv_cache`), where a
  scanned step's traced kind keeps a full cache in every layer, if the cache bytes saved exceed
  the params' bytes. Any other model (one that decodes by a loop over its layers, too) and its
  params as they are."""
  if not getattr(model, 'scan_layers', False) or model.loops_to_decode():
    return model, params
  if model.decode_layers == 'unrolled':
    unstack = unstacking_that_fits(params, stats_of)
    if unstack is not None:
      return model.clone(scan_layers=False), unstack(params)
    model = model.clone(decode_layers='scan')
  if not lm_features.mixed_layers(model):
    return model, params
  if ring_savings(model, cache_size, rows) <= sum(x.nbytes for x in jax.tree.leaves(params)):
    return model, params
  return model.clone(scan_layers=False), _unstacked(params)


def unstacking_that_fits(params: dict[str, Any],
                         stats_of: Callable[[Any], dict[str, int] | None]
                         ) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
  """The program that unstacks `params`, where each device that holds them (host arrays: every
  local device, which the copy may be placed on) has room for what it adds, by its own
  compiled figure (its outputs and temporaries, and its arguments not already on a device),
  with a fifth of its memory left over for the cache and the decode program; else None. A
  device without a limit has room."""
  devices = {d for x in jax.tree.leaves(params) if isinstance(x, jax.Array) for d in x.devices()}
  on_host = any(not isinstance(x, jax.Array) for x in jax.tree.leaves(params))
  limits = {d: (stats_of(d) or {}) for d in devices | (set(jax.local_devices()) if on_host
                                                       else set())}
  if not any(stats.get('bytes_limit') for stats in limits.values()):
    return _unstacked  # CPU: no limit to check, and nothing compiled to find it.
  compiled = _unstacked.lower(params).compile()  # Measured, then run: compiled once.
  analysis = compiled.memory_analysis()
  added = analysis.output_size_in_bytes + analysis.temp_size_in_bytes + (
      analysis.argument_size_in_bytes if on_host else 0)
  fits = all(stats.get('bytes_in_use', 0) + added <= 0.8 * stats['bytes_limit']
             for stats in limits.values() if stats.get('bytes_limit'))
  return compiled if fits else None


def ring_savings(model: Any, cache_size: int, rows: int) -> int:
  """The key and value bytes that rings of `sliding_window` slots in the local layers save
  against full caches of `cache_size` slots, for `rows` rows (0 without a shorter window)."""
  window = model.sliding_window
  if window is None or window >= cache_size:
    return 0
  local = sum(lm_features.is_local_layer(model, i) for i in range(model.num_layers))
  kv_heads = model.num_kv_heads or model.num_heads
  per_slot = 2 * kv_heads * model.head_size() * jnp.dtype(model.dtype).itemsize
  return rows * local * (cache_size - window) * per_slot


_unstacked = jax.jit(unstack_layers)  # One program, not a dispatch per layer and leaf.
