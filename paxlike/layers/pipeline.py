"""GPipe pipeline parallelism over a `stage` mesh axis, with `jax.shard_map` and `lax.ppermute`.

The unit pipelined is a stack of identical layers whose params are stacked on a leading 'layers'
axis (`TransformerLM(scan_layers=True)`'s params['blocks']). The `stage` axis splits that axis
into contiguous chunks, one per stage, and each stage scans its own layers. The batch is cut
into `microbatches`; in iteration t of m + p - 1, stage s runs microbatch t - s and hands its
output to stage s + 1 with a `ppermute`. Only `stage` is manual inside the `shard_map`: the
other mesh axes (`data`, `fsdp`, `model`) stay under GSPMD, so the layers' own sharding
constraints keep working and each microbatch stays sharded over the batch axes. `jax.grad`
through it is the GPipe backward (the transpose of each `ppermute` sends cotangents back a stage)
and gives the unpipelined gradients. `repeats` > 1 runs the circular schedule (each stage holds
`repeats` chunks and a microbatch goes round the stages `repeats` times). See docs/pipeline.md.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from paxlike.errors import UserError

Params = Any
# layer_fn(params of one layer, x [b, ...], extra rows of the same b examples) -> x [b, ...]
LayerFn = Callable[[Params, jax.Array, Any], jax.Array]
AnyMesh = jax.sharding.Mesh | jax.sharding.AbstractMesh
# The mesh axes a batch is split over (as paxlike.core.partitioning.BATCH_AXES: 'expert' is
# data parallel outside MoE layers).
BATCH_AXES = ('data', 'fsdp', 'expert')

__all__ = ['LayerFn', 'bubble_fraction', 'check_mesh', 'check_pipeline', 'pipelined_layers',
           'scan_layers', 'stage_count']


def bubble_fraction(stages: int, microbatches: int, repeats: int = 1) -> float:
  """GPipe's idle fraction (p - 1) / (m + p - 1): each stage works m of m + p - 1 iterations;
  circular with r repeats, (p - 1) / (r m + p - 1)."""
  return (stages - 1) / (repeats * microbatches + stages - 1)


def check_pipeline(*, num_layers: int, stages: int, batch_size: int, microbatches: int,
                   batch_shards: int = 1, repeats: int = 1) -> None:
  """UserError (one line) unless `stages` divides the layers and `microbatches` divides the
  per-stage batch: the rows each device of a stage holds (`batch_size / batch_shards`); a
  circular schedule (`repeats` > 1) needs `repeats * stages` to divide the layers and
  microbatches >= stages."""
  if microbatches < 1:
    raise UserError(f'train.microbatches must be >= 1, got {microbatches}')
  if stages < 1 or num_layers % stages:
    raise UserError(f"mesh axis 'stage' of size {stages} does not divide "
                    f'model.num_layers={num_layers}')
  if repeats < 1:
    raise UserError(f'pipeline repeats must be >= 1, got {repeats}')
  if repeats > 1 and (num_layers % (repeats * stages) or microbatches < stages):
    raise UserError(f'a circular pipeline of {repeats} repeats over {stages} stages needs '
                    f'num_layers ({num_layers}) a multiple of {repeats * stages} and '
                    f'microbatches ({microbatches}) >= {stages}')
  if batch_size % batch_shards or (batch_size // batch_shards) % microbatches:
    raise UserError(f'train.microbatches={microbatches} does not divide the per-stage batch: '
                    f'batch {batch_size} over {batch_shards} data-parallel devices '
                    f'is {batch_size / batch_shards:g} rows per device')


def stage_count(mesh: AnyMesh | None, stage_axis: str = 'stage') -> int:
  """The size of `stage_axis` in `mesh` (1 when the mesh lacks it or there is none)."""
  return dict(mesh.shape).get(stage_axis, 1) if mesh is not None and mesh.axis_names else 1


def check_mesh(mesh: AnyMesh, *, num_layers: int, batch_size: int, microbatches: int,
               repeats: int = 1, stage_axis: str = 'stage',
               batch_axes: tuple[str, ...] = BATCH_AXES) -> None:
  """`check_pipeline` with the stages and batch shards (`batch_axes`) read from `mesh`: what a
  trainer calls before compiling, with its global batch."""
  shards = math.prod(dict(mesh.shape).get(a, 1) for a in batch_axes) if mesh.axis_names else 1
  check_pipeline(num_layers=num_layers, stages=stage_count(mesh, stage_axis),
                 batch_size=batch_size, microbatches=microbatches, batch_shards=shards,
                 repeats=repeats)


def _checkpointed(layer_fn: LayerFn, remat: bool | Callable) -> LayerFn:
  """`layer_fn` under `jax.checkpoint` (remat=True: save nothing; a callable: that policy)."""
  if remat is False:
    return layer_fn
  policy = None if remat is True else remat
  return jax.checkpoint(layer_fn, policy=policy, prevent_cse=False)


def scan_layers(layer_fn: LayerFn, stacked_params: Params, x: jax.Array, extra: Any = None,
                remat: bool | Callable = False) -> jax.Array:
  """The unpipelined stack: `lax.scan` of `layer_fn` over the leading axis of the params."""
  step = _checkpointed(layer_fn, remat)
  return lax.scan(lambda h, p: (step(p, h, extra), None), x, stacked_params)[0]


def _to_microbatches(x: jax.Array, m: int) -> jax.Array:
  """[B, ...] -> [m, B/m, ...], microbatch j = rows j, j + m, ...: each device's rows split
  locally, so a batch sharded over data stays sharded (no resharding)."""
  return jnp.swapaxes(x.reshape(x.shape[0] // m, m, *x.shape[1:]), 0, 1)


def _from_microbatches(x: jax.Array) -> jax.Array:
  """The inverse of `_to_microbatches`."""
  return jnp.swapaxes(x, 0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _stage_program(step: LayerFn, params: Params, x: jax.Array, extra: Any, *, m: int, p: int,
                   r: int, axis: str) -> jax.Array:
  """One stage's program (inside `shard_map`): `params` [r, layers per chunk, ...] are its r
  chunks (chunk k of stage s holds the layers of virtual stage k p + s); x, extra the batch.

  In iteration t, stage s runs pass k = (t - s) // m of microbatch j = (t - s) % m. Stage 0
  reads microbatch t for t < m, then the microbatches stage p - 1 finished, which it keeps in
  `looped` (slot j) until their next pass is due (m >= p: each arrives before it is read).
  """
  stage = lax.axis_index(axis)
  xs = _to_microbatches(x, m)
  extras = jax.tree.map(lambda e: _to_microbatches(e, m), extra)
  shift = [(i, (i + 1) % p) for i in range(p if r > 1 else p - 1)]
  vary = lambda a: lax.pcast(a, (axis,), to='varying')

  def iteration(carry: tuple[jax.Array, jax.Array | None], t: jax.Array):
    state, looped = carry
    first = xs[jnp.minimum(t, m - 1)]  # (in GPipe's drain, a placeholder)
    if r > 1:
      looped = lax.dynamic_update_index_in_dim(looped, state, (t - p) % m, 0)  # from p - 1
      first = jnp.where(t < m, first, looped[t % m])
    h = jnp.where(stage == 0, first, state)
    k, j = jnp.clip((t - stage) // m, 0, r - 1), jnp.clip(t - stage, 0, r * m - 1) % m
    rows = jax.tree.map(lambda e: lax.dynamic_index_in_dim(e, j, keepdims=False), extras)
    chunk = jax.tree.map(lambda a: a[k] if r > 1 else a[0], params)  # this pass's layers
    h = lax.scan(lambda h, lp: (step(lp, h, rows), None), h, chunk)[0]
    return (lax.ppermute(h, axis, shift), looped), h

  carry = (vary(jnp.zeros(xs.shape[1:], xs.dtype)), vary(jnp.zeros_like(xs)) if r > 1 else None)
  _, outs = lax.scan(iteration, carry, jnp.arange(r * m + p - 1))
  # The last stage ends the last pass of microbatch j at iteration (r-1) m + j + p - 1.
  done = outs[(r - 1) * m + p - 1:]
  return _from_microbatches(lax.psum(jnp.where(stage == p - 1, done, jnp.zeros_like(done)), axis))


def pipelined_layers(layer_fn: LayerFn, stacked_params: Params, x: jax.Array, extra: Any = None,
                     *, microbatches: int, mesh: AnyMesh | None = None,
                     repeats: int = 1, stage_axis: str = 'stage',
                     batch_axes: tuple[str, ...] = BATCH_AXES,
                     remat: bool | Callable = False) -> jax.Array:
  """The layer stack on x [B, ...] as a GPipe pipeline over `stage_axis` of `mesh`.

  `stacked_params`: leaves [num_layers, ...]; `extra`: a pytree of per-example arrays [B, ...]
  (segment ids, positions) that each layer sees for its microbatch. `mesh` defaults to the
  context mesh (`jax.set_mesh`); without a `stage_axis` of size > 1 this is `scan_layers`.
  `remat`: jax.checkpoint each layer (True: save nothing; a callable: that policy).
  `repeats` > 1 is the circular schedule: the layers form `repeats * p` chunks, stage s holding
  chunks s, s + p, ..., and each microbatch passes through the stages `repeats` times (bubble
  (p - 1) / (repeats m + p - 1); needs m >= p). Equals `scan_layers(layer_fn, stacked_params,
  x, extra)` up to float round-off.
  """
  mesh = mesh if mesh is not None else jax.sharding.get_abstract_mesh()
  p = stage_count(mesh, stage_axis)
  num_layers = jax.tree.leaves(stacked_params)[0].shape[0]
  check_mesh(mesh, num_layers=num_layers, batch_size=x.shape[0], microbatches=microbatches,
             repeats=repeats, stage_axis=stage_axis, batch_axes=batch_axes)
  if p == 1:
    return scan_layers(layer_fn, stacked_params, x, extra, remat)
  r = repeats
  # [L, ...] -> [r, p, L / (r p), ...]: layer l is in chunk l // (L / (r p)), on stage chunk % p.
  chunks = jax.tree.map(lambda a: a.reshape(r, p, num_layers // (r * p), *a.shape[1:]),
                        stacked_params)
  body = lambda params, x, extra: _stage_program(
      _checkpointed(layer_fn, remat), jax.tree.map(lambda a: a[:, 0], params), x, extra,
      m=microbatches, p=p, r=r, axis=stage_axis)
  in_specs = (jax.tree.map(lambda _: P(None, stage_axis), chunks), P(),
              jax.tree.map(lambda _: P(), extra))
  return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=P(),
                       axis_names={stage_axis})(chunks, x, extra)
