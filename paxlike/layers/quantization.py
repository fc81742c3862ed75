"""A frozen base stored quantized (QLoRA, Dettmers et al. 2023): int8 and 4-bit NormalFloat.

A quantized kernel W [*in, *out] is a small dict that says its own format, so the params tree,
checkpoints and sharding rules need no side table:

    int8        {'int8': int8[W], 'scale': f32[1.., *out]}     per output channel, absmax / 127
    nf4         {'nf4': uint8[W, axis a halved],                 two 4-bit codes a byte, blocks of
                 'absmax': f32[W, axis a / 64]}                  `BLOCK` along the last in axis a
    nf4, double {'nf4': ..., 'absmax_int8': int8[absmax],        the absmax constants less their
                 'absmax_scale': f32[blocks of 256],             mean, quantized to int8 per block
                 'absmax_mean': f32[]}                           of 256 (the paper's "double
                                                                 quantization"; it uses 8-bit
                                                                 floats, this symmetric int8:
                                                                 the same 8.125 bits a block)

Every entry keeps W's rank (the scales with 1 on the axes they span) and its logical axis
names, so a kernel sharded over heads or embed stays sharded the same way, and a stack of
scanned layers (a leading 'layers' axis on every entry; a double-quantized mean then has one
axis) dequantizes with the same broadcasts. `dequantize` rebuilds W in any dtype inside the matmul; nothing here is
ever trained (the trainer trains only LoRA's adapters over a quantized base).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

KINDS = ('none', 'int8', 'nf4')
BLOCK = 64  # NF4 weights per absmax constant (the paper's block size).
SCALE_BLOCK = 256  # absmax constants per scale under double quantization (the paper's).

# The 16 values of 4-bit NormalFloat (QLoRA, appendix E; bitsandbytes' table): quantiles of a
# standard normal, normalised to [-1, 1], with an exact zero.
NF4_CODEBOOK = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], np.float32)


_MIDPOINTS = (NF4_CODEBOOK[1:] + NF4_CODEBOOK[:-1]) / 2


def is_quantized(leaf: Any) -> bool:
  """Whether a params subtree is one quantized kernel (a dict in one of the formats above)."""
  return isinstance(leaf, dict) and ('int8' in leaf or 'nf4' in leaf)


def check(kind: str, shape: tuple[int, ...], in_axes: int) -> None:
  """ValueError (one line) when a kernel of `shape` with `in_axes` leading input axes cannot be
  stored as `kind`."""
  if kind not in KINDS:
    raise ValueError(f'base_quantization must be one of {", ".join(KINDS)}, got {kind!r}')
  axis = shape[in_axes - 1]
  if kind == 'nf4' and axis % BLOCK:
    raise ValueError(f'base_quantization=nf4 needs input axes that are multiples of {BLOCK} '
                     f'(blocks of {BLOCK} weights), got a kernel of shape {shape}')


def quantize(w: jax.Array, kind: str, in_axes: int, double: bool = True) -> dict[str, jax.Array]:
  """W [*in, *out] (its first `in_axes` axes are inputs) stored as `kind` ('int8' or 'nf4')."""
  check(kind, w.shape, in_axes)
  w = jnp.asarray(w, jnp.float32)
  if kind == 'int8':
    scale = jnp.max(jnp.abs(w), axis=tuple(range(in_axes)), keepdims=True) / 127.0
    safe = jnp.where(scale > 0, scale, 1.0)
    return {'int8': jnp.clip(jnp.round(w / safe), -127, 127).astype(jnp.int8),
            'scale': scale}
  axis = in_axes - 1
  blocks = _blocked(w, axis)  # [..., n_blocks, BLOCK, ...] at `axis`.
  absmax = jnp.max(jnp.abs(blocks), axis=axis + 1)
  normed = blocks / jnp.expand_dims(jnp.where(absmax > 0, absmax, 1.0), axis + 1)
  # The nearest code: where each value falls among the midpoints between sorted codes (no
  # [..., 16] distance table: an 8B model's MLP kernel would need 3.8 GB for it).
  codes = jnp.searchsorted(jnp.asarray(_MIDPOINTS), normed).astype(jnp.uint8)
  packed = _pack(codes.reshape(w.shape), axis)
  out = {'nf4': packed}
  out.update(_quantize_absmax(absmax) if double else {'absmax': absmax})
  return out


def dequantize(q: dict[str, jax.Array], dtype: Any = jnp.float32) -> jax.Array:
  """The kernel a quantized dict stores, in `dtype`."""
  if 'int8' in q:
    return (q['int8'].astype(jnp.float32) * q['scale']).astype(dtype)
  if 'absmax' in q:
    absmax = q['absmax']
  else:  # A stack of layers: the absmax of each dequantized on its own.
    unstack = _dequantize_absmax
    for _ in range(q['absmax_mean'].ndim):
      unstack = jax.vmap(unstack)
    absmax = unstack({k: q[k] for k in ('absmax_int8', 'absmax_scale', 'absmax_mean')})
  axis = next(i for i, (c, a) in enumerate(zip(q['nf4'].shape, absmax.shape)) if c != a)
  codes = _unpack(q['nf4'], axis)
  values = nf4_values(codes)
  blocks = _blocked(values, axis) * jnp.expand_dims(absmax, axis + 1)
  return blocks.reshape(codes.shape).astype(dtype)


def nf4_values(codes: jax.Array) -> jax.Array:
  """`NF4_CODEBOOK[codes]` in float32, as the sum over the 16 codes of each value where the code
  is it: exact (one term is nonzero) and elementwise, with no gather from the 16-entry table and
  no int32 index array the size of the kernel."""
  values = jnp.zeros(codes.shape, jnp.float32)
  for code, value in enumerate(NF4_CODEBOOK):
    values = values + jnp.float32(value) * (codes == code).astype(jnp.float32)
  return values


def logical_names(q: dict[str, Any], names: tuple[str | None, ...], in_axes: int
                  ) -> dict[str, tuple[str | None, ...]]:
  """Each entry's logical axis names, from the kernel's `names`."""
  table = {'int8': names, 'scale': (None,) * in_axes + names[in_axes:], 'nf4': names,
           'absmax': names,
           'absmax_int8': names, 'absmax_scale': (None,), 'absmax_mean': ()}
  return {k: table[k] for k in q}


def _blocked(x: jax.Array, axis: int) -> jax.Array:
  """`x` with `axis` split into [size / BLOCK, BLOCK]."""
  return x.reshape(x.shape[:axis] + (x.shape[axis] // BLOCK, BLOCK) + x.shape[axis + 1:])


def _pack(codes: jax.Array, axis: int) -> jax.Array:
  """uint8 codes 0..15 two a byte along `axis`: even positions low nibble, odd high."""
  pairs = codes.reshape(codes.shape[:axis] + (codes.shape[axis] // 2, 2) + codes.shape[axis + 1:])
  low, high = jnp.take(pairs, 0, axis=axis + 1), jnp.take(pairs, 1, axis=axis + 1)
  return (low | (high << 4)).astype(jnp.uint8)


def _unpack(packed: jax.Array, axis: int) -> jax.Array:
  """The codes `_pack` packed, `axis` doubled again."""
  both = jnp.stack([packed & 0xF, packed >> 4], axis=axis + 1)
  return both.reshape(packed.shape[:axis] + (packed.shape[axis] * 2,) + packed.shape[axis + 1:])


def _quantize_absmax(absmax: jax.Array) -> dict[str, jax.Array]:
  """Double quantization: the absmax constants less their mean, int8 per block of 256."""
  mean = jnp.mean(absmax)
  flat = (absmax - mean).reshape(-1)
  blocks = math.ceil(flat.size / SCALE_BLOCK)
  padded = jnp.pad(flat, (0, blocks * SCALE_BLOCK - flat.size)).reshape(blocks, SCALE_BLOCK)
  scale = jnp.max(jnp.abs(padded), axis=1) / 127.0
  codes = jnp.round(padded / jnp.where(scale > 0, scale, 1.0)[:, None])
  codes = codes.reshape(-1)[:flat.size].reshape(absmax.shape).astype(jnp.int8)
  return {'absmax_int8': codes, 'absmax_scale': scale, 'absmax_mean': mean}


def _dequantize_absmax(q: dict[str, jax.Array]) -> jax.Array:
  """The absmax constants that `_quantize_absmax` stored."""
  codes = q['absmax_int8']
  flat = codes.reshape(-1).astype(jnp.float32)
  per = jnp.repeat(q['absmax_scale'], SCALE_BLOCK)[:flat.size]
  return (flat * per).reshape(codes.shape) + q['absmax_mean']


def dequantize_tree(params: Any, dtype: Any = jnp.float32) -> Any:
  """`params` with every quantized kernel replaced by its dequantized array (an unquantized
  model of the same shape then computes what the quantized one does)."""
  if is_quantized(params):
    return dequantize(params, dtype)
  if isinstance(params, dict):
    return {k: dequantize_tree(v, dtype) for k, v in params.items()}
  return params


def declare(module: nn.Module, name: str, shape: tuple[int, ...], names: tuple[str | None, ...],
            init: Any, in_axes: int, kind: str, double: bool, param_dtype: Any) -> Any:
  """Declares kernel `name` of `shape` in `module` (inside its compact method): a plain param
  (`kind` 'none'), or the quantized dict of `init`'s draw. Returns the param's value."""
  if kind == 'none':
    return module.param(name, nn.with_logical_partitioning(init, names), shape, param_dtype)
  check(kind, shape, in_axes)

  def quantized_init(rng: jax.Array) -> dict[str, nn.LogicallyPartitioned]:
    q = quantize(init(rng, shape, jnp.float32), kind, in_axes, double)
    axes = logical_names(q, names, in_axes)
    return {k: nn.LogicallyPartitioned(v, axes[k]) for k, v in q.items()}

  return module.param(name, quantized_init)


class QuantKernel(nn.Module):
  """A frozen quantized kernel as a module: its param 'kernel' (the dict), returned
  dequantized in `dtype`; stands where an nn.Dense's 'kernel' would (same path)."""

  shape: tuple[int, ...]
  names: tuple[str | None, ...]
  kind: str
  double: bool = True
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self) -> jax.Array:
    q = declare(self, 'kernel', self.shape, self.names, nn.initializers.lecun_normal(), 1,
                self.kind, self.double, jnp.float32)
    return dequantize(q, self.dtype)


# The kernels a quantized base stores quantized: (input axes, rank) by param name (the
# attention's [embed, heads, kv] and [heads, kv, embed]; an MLP Dense's [in, out] 'kernel').
_ATTENTION = {'query': (1, 3), 'key': (1, 3), 'value': (1, 3), 'out': (2, 3)}
_MLP_DENSE = ('wi_gate', 'wi_up', 'wi', 'wo')


def quantize_tree(params: Any, kind: str, double: bool = True) -> Any:
  """A float params tree of a TransformerLM as the same model with `base_quantization=kind`
  stores it: every attention and dense-MLP kernel quantized (a scanned stack layer by layer),
  the rest (embeddings, norms, head, LoRA adapters) as it is."""
  if kind == 'none':
    return params

  def walk(tree: Any, path: tuple[str, ...]) -> Any:
    if not isinstance(tree, dict):
      return tree
    out = {}
    for name, sub in tree.items():
      kernel = kernel_axes(path, name)
      if kernel and not isinstance(sub, dict):
        out[name] = _quantize_stacked(sub, kind, *kernel, double)
      else:
        out[name] = walk(sub, path + (name,))
    return out

  return walk(params, ())


def kernel_axes(path: tuple[str, ...], name: str) -> tuple[int, int] | None:
  """(input axes, rank) of the kernel `name` under `path`; None when it is not quantized."""
  if path[-1:] == ('attention',) and name in _ATTENTION:
    return _ATTENTION[name]
  if name == 'kernel' and len(path) >= 2 and path[-1] in _MLP_DENSE and path[-2] == 'mlp':
    return 1, 2
  return None


def _quantize_stacked(w: jax.Array, kind: str, in_axes: int, rank: int, double: bool) -> dict:
  """`quantize` of W, vmapped over the leading axes beyond its `rank` (a scanned stack)."""
  fn = lambda x: quantize(x, kind, in_axes, double)
  for _ in range(w.ndim - rank):
    fn = jax.vmap(fn)
  return fn(w)


def entries(kind: str, double: bool = True) -> tuple[str, ...]:
  """The names a kernel stored as `kind` holds (its dict's keys)."""
  if kind == 'int8':
    return ('int8', 'scale')
  return ('nf4', 'absmax_int8', 'absmax_scale', 'absmax_mean') if double else ('nf4', 'absmax')


@functools.lru_cache(maxsize=None)
def _quantizer(kind: str, in_axes: int, double: bool) -> Any:
  return jax.jit(lambda w: quantize(w, kind, in_axes, double))


def quantize_one(path: tuple[str, ...], value: Any, kind: str, double: bool = True
                 ) -> list[tuple[tuple[str, ...], np.ndarray]]:
  """[(path, value)] of one float param of an unscanned TransformerLM (`path` ends in its
  name) as a `kind`-quantized model stores it: a quantized kernel's entries, else itself. For
  streaming a checkpoint in: one tensor at a time, on the default device."""
  axes = kernel_axes(path[:-1], path[-1]) if kind != 'none' else None
  if axes is None:
    return [(path, value)]
  q = _quantizer(kind, axes[0], double)(jnp.asarray(value, jnp.float32))
  return [(path + (name,), np.asarray(q[name])) for name in entries(kind, double)]
