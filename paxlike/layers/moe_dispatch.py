"""Dropless MoE by grouping: each token's k choices run only their own experts.

The capped path (`moe.route`) gives every expert C slots per row and computes them all, so at
C = T (dropless) the experts run E/k times the active FLOPs. Here the M = N·k (token, choice)
rows are sorted by expert instead, and the experts run on their own rows:

- `plan` lays the rows out expert after expert, each expert's group padded to a multiple of
  `block` rows (zero rows), in a buffer of `(M + E·(block - 1)) // block` blocks (the most
  any routing can need, so shapes stay static);
- `grouped_matmul` multiplies each group by its expert's weight [E, in, out]: 'blocks' as one
  batched matmul of the blocks by their experts' weights (gathered per block: a plain dot on
  every backend, about M + E·block rows of work), 'ragged' as `jax.lax.ragged_dot` (block 1, no
  padding: the grouped-matmul kernel on TPU; other backends lower it to a dense masked dot of E
  times the work, so 'auto' picks it on TPU only).

Exact against the capped path at C = T: the same gates times the same experts' outputs, summed
in choice order. On an 'expert' mesh the expert weights a block needs are gathered to it, where
the capped path moves tokens with all-to-alls. 'blocks' plans the rows of each batch shard
apart (`batch_shards`), so each device sorts and computes only its own tokens; 'ragged' plans
all rows at once (jax 0.12 cannot vmap ragged_dot over a group axis), which on a batch-sharded
mesh every device would repeat, so 'auto' picks it only where the batch is not split.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

Matmul = Callable[[jax.Array, jax.Array], jax.Array]
Constrain = Callable[[jax.Array, tuple], jax.Array]
# The grouped buffers [groups, rows, features]: a group per batch shard.
GROUPED = ('batch', None, None)


class Plan(NamedTuple):
  """Where the M rows go. dest: int32 [M], each row's place in the padded buffer; sizes: int32
  [E], each expert's padded group size; block_expert: int32 [num_blocks], each block's expert.
  (With a leading group axis when `dropless` plans each batch shard's rows apart.)"""

  dest: jax.Array
  sizes: jax.Array
  block_expert: jax.Array


def num_blocks(rows: int, num_experts: int, block: int) -> int:
  """Blocks that hold `rows` rows split into `num_experts` groups, each padded to `block`."""
  return max(1, (rows + num_experts * (block - 1)) // block)


def block_size(rows: int, num_experts: int) -> int:
  """A power of two near rows / (4E), in [8, 128]: padding costs at most a quarter more rows
  when the routing is balanced, and a block is a matmul worth gathering a weight for."""
  size = 8
  while size < 128 and size * 2 * 4 * num_experts <= rows:
    size *= 2
  return size


def plan(experts: jax.Array, num_experts: int, block: int) -> Plan:
  """The padded grouped layout of rows picking `experts` (int [M])."""
  rows = experts.shape[0]
  order = jnp.argsort(experts, stable=True)
  counts = jnp.zeros(num_experts, jnp.int32).at[experts].add(1)
  sizes = (counts + block - 1) // block * block
  starts, padded_starts = jnp.cumsum(counts) - counts, jnp.cumsum(sizes) - sizes
  picked = experts[order]
  dest_sorted = padded_starts[picked] + jnp.arange(rows, dtype=jnp.int32) - starts[picked]
  dest = jnp.zeros(rows, jnp.int32).at[order].set(dest_sorted.astype(jnp.int32))
  first_rows = jnp.arange(num_blocks(rows, num_experts, block), dtype=jnp.int32) * block
  block_expert = jnp.searchsorted(jnp.cumsum(sizes), first_rows, side='right')
  return Plan(dest, sizes, jnp.minimum(block_expert, num_experts - 1).astype(jnp.int32))


def scatter(x: jax.Array, p: Plan, block: int) -> jax.Array:
  """Rows x [M, d] -> the padded buffer [num_blocks · block, d] (padding rows zero)."""
  buffer = jnp.zeros((p.block_expert.shape[0] * block, x.shape[-1]), x.dtype)
  return buffer.at[p.dest].set(x, unique_indices=True)


def gather(buffer: jax.Array, p: Plan) -> jax.Array:
  """The padded buffer's rows back in row order: [M, d]."""
  return buffer[p.dest]


def grouped_matmul(buffer: jax.Array, w: jax.Array, p: Plan, impl: str) -> jax.Array:
  """buffer [num_blocks · block, in] times each row's expert weight `w` [E, in, out]."""
  if impl == 'ragged':
    return jax.lax.ragged_dot(buffer, w, p.sizes)
  block = buffer.shape[0] // p.block_expert.shape[0]
  blocks = buffer.reshape(-1, block, buffer.shape[-1])
  # Each block's weight picked by a one-hot matmul (exact: HIGHEST keeps f32 weights whole on
  # TPU), not a gather: XLA:CPU ran the gather's transpose, a scatter-add, element by element.
  pick = jax.nn.one_hot(p.block_expert, w.shape[0], dtype=w.dtype)
  weights = jnp.einsum('ne,eio->nio', pick, w, precision=jax.lax.Precision.HIGHEST)
  out = jnp.einsum('nbi,nio->nbo', blocks, weights)
  return out.reshape(-1, w.shape[-1])


def batch_shards() -> int:
  """How many ways the logical rules in context split 'batch' over the mesh in context."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return 1
  axes = nn.logical_to_mesh_axes(('batch',))[0]
  axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
  return math.prod(dict(mesh.shape).get(a, 1) for a in axes)


IMPLS = ('auto', 'blocks', 'ragged', 'slots')


def resolve(impl: str, groups: int = 1, expert_shards: int = 1) -> str:
  """'auto' -> 'slots' (the capped path with a slot per token, C = T: every expert on every
  token, its tokens moved to it by all-to-alls) where the mesh splits the experts, since the
  grouped matmuls gather every expert's weights to each device (on a 2 data × 4 expert CPU mesh
  that step took 2.2x the slots one's time at 0.39x its FLOPs); else 'ragged' on TPU (a
  grouped-matmul kernel) when the batch is in one group (see the module docstring), else
  'blocks'."""
  if impl not in IMPLS:
    raise ValueError(f'dispatch must be one of {", ".join(map(repr, IMPLS))}, got {impl!r}')
  if impl == 'auto':
    if expert_shards > 1:
      return 'slots'
    return 'ragged' if jax.default_backend() == 'tpu' and groups == 1 else 'blocks'
  return impl


def dropless(x: jax.Array, choices: jax.Array, gates: jax.Array, num_experts: int,
             experts: Callable[[jax.Array, Matmul], jax.Array], impl: str = 'auto',
             groups: int = 1, constrain: Constrain = lambda y, _: y) -> jax.Array:
  """Σ_j gates[..., j] · expert_{choices[..., j]}(x): x [B, T, d], choices and gates [B, T, k].

  The rows are planned in `groups` groups of B / groups batch rows (one per batch shard, so
  each device sorts and computes its own tokens; `constrain(y, logical_names)` places them;
  'ragged' plans one group).
  `experts(buffer, matmul)` runs the experts on the padded buffers [groups, R, d], with
  `matmul(rows, w)` their grouped matmul by an expert weight w [E, in, out]."""
  impl = resolve(impl, groups)
  groups = 1 if impl == 'ragged' else groups
  b, t, d = x.shape
  k = choices.shape[-1]
  rows_per_group = b // groups * t * k
  flat = choices.reshape(groups, rows_per_group).astype(jnp.int32)  # Row n·k + j: n's j-th.
  block = 1 if impl == 'ragged' else block_size(rows_per_group, num_experts)
  p = jax.vmap(lambda e: plan(e, num_experts, block))(flat)
  rows = jnp.repeat(x.reshape(groups, b // groups * t, d), k, axis=1,
                    total_repeat_length=rows_per_group)
  buffer = constrain(jax.vmap(lambda r, q: scatter(r, q, block))(rows, p), GROUPED)

  def matmul(buffer: jax.Array, w: jax.Array) -> jax.Array:
    if impl == 'ragged':  # One group.
      return grouped_matmul(buffer[0], w, jax.tree.map(lambda a: a[0], p), impl)[None]
    return jax.vmap(lambda r, q: grouped_matmul(r, w, q, impl))(buffer, p)

  out = constrain(experts(buffer, matmul), GROUPED)
  out = jax.vmap(gather)(out, p).reshape(b, t, k, d)
  return jnp.einsum('btkd,btk->btd', out, gates.astype(out.dtype))
