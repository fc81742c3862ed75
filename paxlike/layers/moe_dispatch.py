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
in choice order. On an 'expert' mesh the expert weights a block needs are gathered to it (GSPMD
partitions the sort and the gathers), where the capped path moves tokens with all-to-alls.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp


class Plan(NamedTuple):
  """Where the M rows go. dest: int32 [M], each row's place in the padded buffer; sizes: int32
  [E], each expert's padded group size; block_expert: int32 [num_blocks], each block's expert."""

  dest: jax.Array
  sizes: jax.Array
  block_expert: jax.Array
  block: int


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
  return Plan(dest, sizes, jnp.minimum(block_expert, num_experts - 1).astype(jnp.int32), block)


def scatter(x: jax.Array, p: Plan) -> jax.Array:
  """Rows x [M, d] -> the padded buffer [num_blocks · block, d] (padding rows zero)."""
  buffer = jnp.zeros((p.block_expert.shape[0] * p.block, x.shape[-1]), x.dtype)
  return buffer.at[p.dest].set(x, unique_indices=True)


def gather(buffer: jax.Array, p: Plan) -> jax.Array:
  """The padded buffer's rows back in row order: [M, d]."""
  return buffer[p.dest]


def grouped_matmul(buffer: jax.Array, w: jax.Array, p: Plan, impl: str) -> jax.Array:
  """buffer [num_blocks · block, in] times each row's expert weight `w` [E, in, out]."""
  if impl == 'ragged':
    return jax.lax.ragged_dot(buffer, w, p.sizes)
  blocks = buffer.reshape(-1, p.block, buffer.shape[-1])
  out = jnp.einsum('nbi,nio->nbo', blocks, w[p.block_expert])
  return out.reshape(-1, w.shape[-1])


def resolve(impl: str) -> str:
  """'auto' -> 'ragged' on TPU (a grouped-matmul kernel), else 'blocks'."""
  if impl not in ('auto', 'blocks', 'ragged'):
    raise ValueError(f"dispatch must be 'auto', 'blocks' or 'ragged', got {impl!r}")
  if impl == 'auto':
    return 'ragged' if jax.default_backend() == 'tpu' else 'blocks'
  return impl


def dropless(x: jax.Array, choices: jax.Array, gates: jax.Array, num_experts: int,
             experts: Callable[[jax.Array, Plan], jax.Array], impl: str = 'auto') -> jax.Array:
  """Σ_j gates[..., j] · expert_{choices[..., j]}(x): x [B, T, d], choices and gates [B, T, k];
  `experts(buffer, plan)` runs the grouped experts on the padded buffer [rows, d]."""
  impl = resolve(impl)
  b, t, d = x.shape
  k = choices.shape[-1]
  flat = choices.reshape(-1).astype(jnp.int32)  # Row n·k + j: token n's j-th choice.
  block = 1 if impl == 'ragged' else block_size(flat.shape[0], num_experts)
  p = plan(flat, num_experts, block)
  rows = jnp.repeat(x.reshape(b * t, d), k, axis=0, total_repeat_length=b * t * k)
  out = gather(experts(scatter(rows, p), p), p).reshape(b, t, k, d)
  return jnp.einsum('btkd,btk->btd', out, gates.astype(out.dtype))

