"""KV-cache generation for a batch of ragged prompts: one prefill, then one `lax.while_loop`.

Prompts are left-padded to a common length P, so every row's next token lands in the same cache
slot. The prefill writes cache slots [0, P) (the padding with segment id 0, which real tokens
never attend) and samples each row's first token; the loop then feeds one token per step, each
row at its own position (counted from its first real token), until every row has produced EOS
or `max_new_tokens`. Both are jitted once per (model, options, mesh) and prompt shape; the
cache is sized once per request, in a few buckets (`shapes_for`), and the number of new tokens
is traced, so a run compiles one prefill and one loop for any length and any number of prompts
(in batches of one shape). The loop donates its state, so the cache is updated in place and no
step returns to Python.

On a mesh (`mesh=`, with logical `rules`, `partitioning.DEFAULT_RULES` by default) the params
may be sharded; the cache follows the kv activations' logical axes ('batch', 'length',
'kv_heads', 'kv'), and the batch is padded with idle rows to a multiple of its shards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Callable, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from paxlike.core import partitioning
from paxlike.core import program_store
from paxlike.decode.sampling import Sampling, sample
from paxlike.errors import UserError
from paxlike.layers import lora, stacking


@dataclasses.dataclass(frozen=True)
class Options:
  """What one generation program is: static, so each distinct value compiles once. The number of
  new tokens is not part of it (the loop's `limit` is traced): any length that fits
  `cache_size` runs the same program."""

  cache_size: int
  sampling: Sampling = Sampling()
  eos_id: int | None = None


class State(NamedTuple):
  """The loop carry: the cache, each row's last token and its position, which rows are done,
  the tokens so far (`out[:, :count]`) and the sampling key."""

  cache: Any
  last: jax.Array  # int32 [B]
  position: jax.Array  # int32 [B]
  done: jax.Array  # bool [B]
  out: jax.Array  # int32 [B, cache_size]
  count: jax.Array  # int32 []
  rng: jax.Array


# The loop's carry is its programs' output: program_store keeps them as jax.export files.
jax.export.register_namedtuple_serialization(State, serialized_name='paxlike.decode.State')


class Decoder(NamedTuple):
  """Jitted, each run in its mesh context: `prefill(params, tokens, lengths, live, rng)`
  (first token sampled) and `loop(params, state, limit)` (steps until `count` reaches `limit`,
  a traced int32; donates `state`)."""

  prefill: Callable[..., State]
  loop: Callable[[Any, State, Any], State]


def left_pad(prompts: Sequence[np.ndarray], pad_id: int, width: int | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
  """(tokens int32 [B, P], lengths int32 [B]): the prompts right-aligned, padded by `pad_id` to
  `width` columns (default: the longest prompt)."""
  lengths = np.asarray([len(p) for p in prompts], np.int32)
  tokens = np.full((len(prompts), width or int(lengths.max())), pad_id, np.int32)
  for row, prompt in enumerate(prompts):
    tokens[row, tokens.shape[1] - len(prompt):] = prompt
  return tokens, lengths


def _doubling(least: int, start: int) -> int:
  """The smallest `start * 2**i` >= `least`."""
  size = start
  while size < least:
    size *= 2
  return size


def shapes_for(longest: int, max_new_tokens: int, cache_len: int) -> tuple[int, int]:
  """(cache size, prompt width) of a request: the cache the smallest of 128, 256, 512, ...
  (capped at `cache_len`) that holds the longest prompt plus its new tokens (the last one is
  never fed back), the prompts left-padded to the smallest of 16, 32, 64, ... that still
  leaves room for the new tokens. A few buckets, so the persistent compilation cache serves a
  rerun with other prompts or another length; attention reads the whole cache every step, so
  the buckets stay near what the request needs."""
  cache_size = min(_doubling(longest + max_new_tokens - 1, 128), cache_len)
  width = max(longest, min(_doubling(longest, 16), cache_size - max_new_tokens + 1))
  return cache_size, width


def _apply(model: nn.Module, params: Any, cache: Any, tokens: jax.Array, segment_ids: jax.Array,
           positions: jax.Array, cache_len: int | None = None) -> tuple[jax.Array, Any]:
  """The last column's logits [B, V] of a decode call, and the updated cache."""
  variables = {'params': params} if cache is None else {'params': params, 'cache': cache}
  logits, mutated = model.apply(variables, tokens, segment_ids=segment_ids, positions=positions,
                                decode=True, cache_len=cache_len, mutable=['cache'])
  return logits[:, -1], mutated['cache']


def _is_eos(token: jax.Array, eos_id: int | None) -> jax.Array:
  return jnp.zeros(token.shape, bool) if eos_id is None else token == eos_id


def prefill(model: nn.Module, options: Options, params: Any, tokens: jax.Array,
            lengths: jax.Array, live: jax.Array, rng: jax.Array) -> State:
  """Runs the left-padded prompts `tokens` [B, P] (real lengths `lengths`) into a fresh cache
  and samples the first token of each row; rows with `live` False start done."""
  slots = jnp.arange(tokens.shape[1])[None]
  pad = tokens.shape[1] - lengths[:, None]
  segment_ids = (slots >= pad).astype(jnp.int32)
  positions = jnp.maximum(slots - pad, 0).astype(jnp.int32)
  logits, cache = _apply(model, params, None, tokens, segment_ids, positions, options.cache_size)
  token = sample(jax.random.fold_in(rng, 0), logits, options.sampling)
  out = jnp.zeros((tokens.shape[0], options.cache_size), jnp.int32).at[:, 0].set(token)
  done = ~live | _is_eos(token, options.eos_id)
  return State(cache, token, lengths.astype(jnp.int32), done, out, jnp.int32(1), rng)


def decode_loop(model: nn.Module, options: Options, params: Any, state: State,
                limit: jax.Array) -> State:
  """Feeds each row's last token until every row is done or `count` reaches `limit`."""
  running = lambda s: (s.count < limit) & ~jnp.all(s.done)
  return jax.lax.while_loop(running, functools.partial(_step, model, options, params), state)


def _step(model: nn.Module, options: Options, params: Any, s: State) -> State:
  """One token per row: feed the last one, sample the next."""
  ones = jnp.ones_like(s.last)[:, None]
  logits, cache = _apply(model, params, s.cache, s.last[:, None], ones, s.position[:, None])
  token = sample(jax.random.fold_in(s.rng, s.count), logits, options.sampling)
  token = jnp.where(s.done, 0, token)
  out = jax.lax.dynamic_update_index_in_dim(s.out, token, s.count, axis=1)
  done = s.done | _is_eos(token, options.eos_id)
  return State(cache, token, s.position + 1, done, out, s.count + 1, s.rng)


def _context(mesh: Mesh | None, rules: partitioning.LogicalRules | None) -> Any:
  stack = contextlib.ExitStack()
  if mesh is not None:
    stack.enter_context(jax.set_mesh(mesh))
    stack.enter_context(nn.logical_axis_rules(rules))
  return stack


@functools.lru_cache(maxsize=16)
def decoder(model: nn.Module, options: Options, mesh: Mesh | None = None,
            rules: partitioning.LogicalRules | None = None,
            store: program_store.Store | None = None) -> Decoder:
  """The jitted prefill and loop of `model` (remat off: nothing is differentiated) for
  `options`, run under `mesh` and its logical `rules` (already fitted to the mesh); with a
  `store`, their traces are read from it (or written to it) instead of made anew."""
  model = model.clone(remat_policy='none', parent=None)
  jitted = (jax.jit(functools.partial(prefill, model, options)),
            jax.jit(functools.partial(decode_loop, model, options), donate_argnums=(1,)))
  if store is not None:
    jitted = (store.traced(jitted[0], ('prefill', repr(model), options, rules), mesh),
              store.traced(jitted[1], ('loop', repr(model), options, rules), mesh, (1,)))

  def in_context(fn: Callable[..., State]) -> Callable[..., State]:
    def run(*args: Any) -> State:
      with _context(mesh, rules):
        return fn(*args)
    return run

  return Decoder(*(in_context(fn) for fn in jitted))


def cache_len_for(model: nn.Module, longest: int, max_new_tokens: int) -> int:
  """The cache a request of prompts up to `longest` tokens needs: `model.max_len`, or more for
  a rope model (it has no position table) whose prompt plus new tokens take more slots (the
  last new token is never fed back, so it needs none)."""
  if not model.rope:
    return model.max_len
  return max(model.max_len, longest + max_new_tokens - 1)


def check_request(model: nn.Module, prompts: Sequence[np.ndarray], max_new_tokens: int,
                  cache_len: int) -> None:
  """UserError for what cannot be generated: no prompts, an empty one, ids outside the
  vocabulary, or a prompt plus its new tokens longer than the cache."""
  if not prompts:
    raise UserError('no prompts to decode')
  if max_new_tokens < 1:
    raise UserError(f'the number of new tokens must be positive, got {max_new_tokens}')
  for i, prompt in enumerate(prompts):
    if prompt.ndim != 1 or not len(prompt):
      raise UserError(f'prompt {i} is empty (or not a 1-d array of token ids)')
    if prompt.min() < 0 or prompt.max() >= model.vocab_size:
      raise UserError(f'prompt {i} has token ids outside the model vocabulary '
                      f'[0, {model.vocab_size})')
  longest = max(len(p) for p in prompts)
  # The last new token is never fed back, so it needs no slot.
  if longest + max_new_tokens - 1 > cache_len:
    raise UserError(f'a prompt of {longest} tokens plus {max_new_tokens} new tokens needs '
                    f'{longest + max_new_tokens - 1} cache slots, but cache_len is {cache_len}')
  if not model.rope and cache_len > model.max_len:
    raise UserError(f'cache_len {cache_len} exceeds max_len={model.max_len} of a model with '
                    'learned positions')


def _batch_shards(mesh: Mesh | None, rules: partitioning.LogicalRules | None) -> int:
  """How many ways the rules split the batch dimension over `mesh`."""
  if mesh is None:
    return 1
  axes = nn.logical_to_mesh_axes(('batch',), rules)[0]
  axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
  return int(np.prod([mesh.shape[a] for a in axes]))


def cut(out: np.ndarray, count: int, eos_id: int | None) -> list[np.ndarray]:
  """Each row's first `count` tokens, cut after its first EOS (kept)."""
  rows = []
  for row in np.asarray(out)[:, :count]:
    stop = np.flatnonzero(row == eos_id) if eos_id is not None else ()
    rows.append(row[:stop[0] + 1] if len(stop) else row)
  return rows


def generate(model: nn.Module, params: Any, prompts: Sequence[np.ndarray], *,
             max_new_tokens: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             eos_id: int | None = None, seed: int = 0, cache_len: int | None = None,
             pad_id: int = 0, mesh: Mesh | None = None,
             rules: partitioning.LogicalRules | None = None, batch_size: int | None = None,
             on_first_token: Callable[[], None] | None = None,
             store: program_store.Store | None = None) -> list[np.ndarray]:
  """The new tokens (int32, cut after EOS) of each prompt, sampled from `model` with a KV cache
  of at most `cache_len` slots (default `model.max_len`; see `shapes_for`). Greedy at
  temperature 0. The prompts go in batches of `batch_size` (default: all at once), the last
  one padded with idle rows, so every batch runs the same compiled prefill and loop; batch i > 0
  samples from key `fold_in(key(seed), i)`. `on_first_token` is called once the first batch's
  first tokens are on the host side. With `mesh`, runs under it and `rules` (default
  `partitioning.DEFAULT_RULES`). LoRA adapters are merged into the kernels first, and a scanned
  stack decodes as `model.decode_layers` says (`stacking.decode_layout`: by default unrolled,
  its params split per layer once, where the devices have room for the copy). With a `store`
  (program_store.py), the prefill's and loop's traces come from it when it has them."""
  prompts = [np.asarray(p, np.int32) for p in prompts]
  # Adapters over a quantized base stay beside it (weight-only quantized decode).
  if getattr(model, 'base_quantization', 'none') == 'none':
    model, params = lora.LoraSpec.of(model).merged(model, params)
  cache_len = cache_len or model.max_len
  check_request(model, prompts, max_new_tokens, cache_len)
  if mesh is not None:
    rules = partitioning.rules_for_mesh(rules or partitioning.DEFAULT_RULES, mesh)
  cache_size, width = shapes_for(max(map(len, prompts)), max_new_tokens, cache_len)
  rows = batch_size or len(prompts)
  rows += -rows % _batch_shards(mesh, rules)
  model, params = stacking.decode_layout(model, params, cache_size, rows)
  options = Options(cache_size, Sampling(temperature, top_k, top_p), eos_id)
  run = decoder(model, options, mesh, rules, store)
  limit, key, out = np.int32(max_new_tokens), jax.random.key(seed), []
  for i in range(0, len(prompts), rows):
    batch = prompts[i:i + rows]
    tokens, lengths = left_pad(batch + [np.asarray([pad_id], np.int32)] * (rows - len(batch)),
                               pad_id, width)
    live = np.arange(rows) < len(batch)
    state = run.prefill(params, tokens, lengths, live, key if not i else
                        jax.random.fold_in(key, i // rows))
    if not i and on_first_token is not None:
      state.last.block_until_ready()
      on_first_token()
    state = run.loop(params, state, limit)
    tokens_out, count = jax.device_get((state.out, state.count))
    out += cut(tokens_out, int(count), eos_id)[:len(batch)]
  return out
