"""A local (sliding-window) layer's KV cache holds its window, as a ring (layers/kv_cache.py),
and decodes as the full cache does: the scanned model of the same weights (its traced
local/global flags keep a full cache per layer) and the whole model rerun without a cache give
the same greedy tokens and logits within float tolerance, for prompts shorter and longer than
the window and generations that run past it. `generate` decodes a scanned stack of mixed layers
unrolled (`stacking.decode_layout`), so there too the local layers hold only their window."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.decode import engine, generate
from paxlike.layers import TransformerLM, kv_cache, stack_layers, stacking
from tests.decode.test_generate import params_of, prompts_of, recompute_greedy

WINDOW, CACHE = 4, 32
# Gemma 2's layout at test size: local, global, local, global; soft-capped like Gemma 2.
GEMMA2 = dict(vocab_size=64, num_layers=4, d_model=32, num_heads=4, num_kv_heads=2, d_ff=64,
              max_len=CACHE, sliding_window=WINDOW, global_every=2, local_rope_base=10_000.0,
              rope_base=1_000_000.0, attn_logit_softcap=50.0)
# Mistral: every layer local.
MISTRAL = dict(vocab_size=64, num_layers=2, d_model=32, num_heads=4, num_kv_heads=1, d_ff=64,
               max_len=CACHE, sliding_window=WINDOW)


def prefill_cache(model, params, width: int, rows: int = 2) -> dict:
  """The shapes of the cache ({layer: its variables}) a prefill of `rows` rows of `width`
  columns makes, with CACHE slots."""
  tokens = jnp.zeros((rows, width), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(width), tokens.shape)
  _, cache = jax.eval_shape(lambda p: model.apply(
      {'params': p}, tokens, positions=positions, decode=True, cache_len=CACHE,
      mutable=['cache']), params)
  return cache['cache']


def cache_shapes(model, params, width: int) -> dict:
  """{layer: key shape} of the cache a prefill of `width` columns makes."""
  return {name: next(leaf.shape for path, leaf in jax.tree_util.tree_leaves_with_path(layer)
                     if jax.tree_util.keystr(path).endswith("['key']"))
          for name, layer in prefill_cache(model, params, width).items()}


def test_local_layers_cache_only_their_window():
  model = TransformerLM(**GEMMA2)
  shapes = cache_shapes(model, params_of(model), 6)
  # [B, K, slots, H]: local layers (0, 2) hold WINDOW slots, global ones (1, 3) all CACHE.
  assert {name: s[2] for name, s in shapes.items()} == {
      'block_0': WINDOW, 'block_1': CACHE, 'block_2': WINDOW, 'block_3': CACHE}


def decode_logits(model, params, tokens: np.ndarray, lengths: np.ndarray, steps: int):
  """Logits [B, 1 + steps, V]: the left-padded prompts' last column, then `steps` greedy
  steps, each row at its own position (as paxlike.decode.engine feeds them)."""
  slots = np.arange(tokens.shape[1])[None]
  pad = tokens.shape[1] - lengths[:, None]
  step = jax.jit(lambda p, c, x, s, pos: model.apply(
      {'params': p, 'cache': c}, x, segment_ids=s, positions=pos, decode=True,
      mutable=['cache']))
  prefill = jax.jit(lambda p, x, s, pos: model.apply(
      {'params': p}, x, segment_ids=s, positions=pos, decode=True, cache_len=CACHE,
      mutable=['cache']))
  logits, cache = prefill(params, tokens, (slots >= pad).astype(np.int32),
                          np.maximum(slots - pad, 0).astype(np.int32))
  out, position = [logits[:, -1]], lengths.copy()
  for _ in range(steps):
    last = np.asarray(jnp.argmax(out[-1], axis=-1), np.int32)[:, None]
    logits, cache = step(params, cache['cache'], last, np.ones_like(last), position[:, None])
    out.append(logits[:, -1])
    position = position + 1
  return np.stack([np.asarray(x) for x in out], axis=1)


def recomputed_logits(model, params, prompt: np.ndarray, ring: np.ndarray) -> np.ndarray:
  """The logits [1 + steps, V] the whole model (no cache) gives at the prompt's last token
  and at each greedy token of `ring` [1 + steps, V] but the last."""
  greedy = ring.argmax(-1)[:-1]
  sequence = np.concatenate([prompt, greedy]).astype(np.int32)
  window = np.zeros(CACHE, np.int32)
  window[:len(sequence)] = sequence
  logits = jax.jit(model.apply)({'params': params}, window[None])[0]
  return np.asarray(logits[len(prompt) - 1:len(sequence)])


@pytest.mark.parametrize('fields', [GEMMA2, MISTRAL], ids=['gemma2', 'mistral'])
def test_ring_decode_equals_the_full_cache_for_short_and_long_prompts(fields):
  model = TransformerLM(**fields)
  params = params_of(model)
  # Prompts of 2 (< WINDOW) and 11 (> WINDOW) tokens, left-padded in one batch; 12 greedy steps
  # carry the short one past the window too.
  prompts = prompts_of([2, 11], seed=3)
  width = 11
  tokens = np.zeros((2, width), np.int32)
  for row, p in enumerate(prompts):
    tokens[row, width - len(p):] = p
  lengths = np.asarray([len(p) for p in prompts], np.int32)
  ring = decode_logits(model, params, tokens, lengths, 12)
  for row, prompt in enumerate(prompts):  # The whole model, no cache.
    want = recomputed_logits(model, params, prompt, ring[row])
    np.testing.assert_allclose(ring[row], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
  if fields is GEMMA2:  # Mixed layers: the scanned model keeps a full cache in every layer.
    scanned, stacked = model.clone(scan_layers=True), stack_layers(params, model.num_layers)
    assert cache_shapes(scanned, stacked, width)['blocks'][3] == CACHE
    full = decode_logits(scanned, stacked, tokens, lengths, 12)
    np.testing.assert_allclose(ring, full, rtol=1e-4, atol=1e-4 * np.abs(full).max())
    np.testing.assert_array_equal(ring.argmax(-1), full.argmax(-1))


@pytest.mark.parametrize('fields', [GEMMA2, MISTRAL], ids=['gemma2', 'mistral'])
def test_generate_with_ring_caches_equals_full_recompute(fields):
  model = TransformerLM(**fields)
  params = params_of(model)
  prompts = prompts_of([3, 9, 1], seed=5)
  got = generate(model, params, prompts, max_new_tokens=10, cache_len=CACHE)
  for prompt, tokens in zip(prompts, got):
    np.testing.assert_array_equal(tokens, recompute_greedy(model, params, prompt, 10))


def test_ring_slots_and_writes_wrap():
  assert kv_cache.ring_slots(jnp.int32(0), 3).tolist() == [-1, -1, -1]
  assert kv_cache.ring_slots(jnp.int32(2), 3).tolist() == [0, 1, -1]
  assert kv_cache.ring_slots(jnp.int32(5), 3).tolist() == [3, 4, 2]
  ring = jnp.zeros((1, 3), jnp.int32)
  # Slots 0..6 written at once: the ring keeps 4, 5, 6 at entries 1, 2, 0.
  ring = kv_cache.ring_write(ring, jnp.arange(7)[None], jnp.int32(0), axis=1)
  assert ring.tolist() == [[6, 4, 5]]
  ring = kv_cache.ring_write(ring, jnp.asarray([[7]]), jnp.int32(7), axis=1)
  assert ring.tolist() == [[6, 7, 5]]


# Gemma 3's pattern (five local, one global) at test size: 5 layers, every 3rd global, so the
# stack is no multiple of the pattern; and a scanned MoE stack (two layers a step) of Gemma 2's.
GEMMA3 = {**GEMMA2, 'num_layers': 5, 'global_every': 3}
GEMMA2_MOE = {**GEMMA2, 'num_experts': 2, 'experts_per_token': 1, 'moe_every': 2,
              'capacity_factor': None}


def kv_bytes(model, params, width: int, rows: int) -> int:
  """The key and value bytes of the cache a prefill of `rows` rows makes (CACHE slots)."""
  cache = prefill_cache(model, params, width, rows)
  return sum(leaf.size * leaf.dtype.itemsize
             for path, leaf in jax.tree_util.tree_leaves_with_path(cache)
             if jax.tree_util.keystr(path).endswith(("['key']", "['value']")))


def models_given_to_the_decoder(monkeypatch) -> list:
  """The models `generate` compiles its decoder for, from now on."""
  seen, real = [], engine.decoder
  monkeypatch.setattr(engine, 'decoder', lambda model, *args: seen.append(model) or
                      real(model, *args))
  return seen


ROWS = 64  # Enough rows for the test models' rings to save more than their params' bytes.


@pytest.mark.parametrize('fields', [GEMMA2, GEMMA3, GEMMA2_MOE], ids=['gemma2', 'gemma3', 'moe'])
def test_a_scanned_mixed_stack_decodes_unrolled_with_windowed_caches(fields, monkeypatch):
  model = TransformerLM(**fields)
  params = params_of(model)
  group = model.moe_every if model.num_experts else 1
  scanned = model.clone(scan_layers=True, decode_layers='scan')
  stacked = stack_layers(params, model.num_layers, group)
  # What the rings save, against the caches themselves: the scanned stack's full ones less the
  # unrolled model's.
  saved = kv_bytes(scanned, stacked, 6, ROWS) - kv_bytes(model, params, 6, ROWS)
  assert stacking.ring_savings(scanned, CACHE, ROWS) == saved > 0
  assert saved > sum(x.nbytes for x in jax.tree.leaves(params))
  layout, unrolled = stacking.decode_layout(scanned, stacked, CACHE, ROWS)
  assert not layout.scan_layers
  jax.tree.map(np.testing.assert_array_equal, unrolled, params)  # The same weights, unstacked.
  slots = {name: s[2] for name, s in cache_shapes(layout, unrolled, 6).items()}
  assert slots == {f'block_{i}': WINDOW if model.is_local_layer(i) else CACHE
                   for i in range(model.num_layers)}
  decoded = models_given_to_the_decoder(monkeypatch)
  prompts = prompts_of([3, 9, 5, 1] * (ROWS // 4), seed=7)
  got = generate(scanned, stacked, prompts, max_new_tokens=10, cache_len=CACHE)
  assert [m.scan_layers for m in decoded] == [False]
  want = generate(model, params, prompts, max_new_tokens=10, cache_len=CACHE)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)


def test_a_model_that_unrolling_would_not_shrink_enough_keeps_its_layout(monkeypatch):
  """Uniform layers, an unrolled stack, a window that spans the cache (a ring of the whole
  cache), and rings that save less than the params' bytes (two rows): the model and params as
  they are, no copy."""
  model = TransformerLM(**GEMMA2, decode_layers='scan')
  scanned, stacked = model.clone(scan_layers=True), stack_layers(params_of(model), 4)
  for layout, params, cache, rows in (
      (TransformerLM(**MISTRAL, scan_layers=True, decode_layers='scan'), {'x': np.zeros(2)},
       CACHE, ROWS),
      (model, {'x': np.zeros(2)}, CACHE, ROWS), (scanned, stacked, WINDOW, ROWS),
      (scanned, stacked, CACHE, 2)):
    assert stacking.decode_layout(layout, params, cache, rows) == (layout, params)
  decoded = models_given_to_the_decoder(monkeypatch)
  generate(scanned, stacked, prompts_of([3, 9], seed=7), max_new_tokens=4, cache_len=CACHE)
  assert [m.scan_layers for m in decoded] == [True]


def test_a_scanned_stack_decodes_unrolled_by_default_where_a_copy_fits(monkeypatch):
  """The default ('unrolled') splits a uniform stack's params per layer, the same weights, and
  decodes the unrolled model's tokens; a device without room for the copy decodes the stack
  by 'scan' (memory stats as a TPU reports them)."""
  model = TransformerLM(**MISTRAL)
  params = params_of(model)
  scanned, stacked = model.clone(scan_layers=True), stack_layers(params, model.num_layers)
  layout, unrolled = stacking.decode_layout(scanned, stacked, CACHE, 2)
  assert not layout.scan_layers
  jax.tree.map(np.testing.assert_array_equal, unrolled, params)
  on_device = jax.device_put(stacked)
  held = sum(x.nbytes for x in jax.tree.leaves(on_device))
  full = lambda device: {'bytes_limit': 10 * held, 'bytes_in_use': int(7.5 * held)}
  roomy = lambda device: {'bytes_limit': 10 * held, 'bytes_in_use': int(6.5 * held)}
  assert stacking.unstacking_that_fits(on_device, full) is None
  unstack = stacking.unstacking_that_fits(on_device, roomy)
  jax.tree.map(np.testing.assert_array_equal, unstack(on_device), params)
  layout, kept = stacking.decode_layout(scanned, on_device, CACHE, 2, stats_of=full)
  assert (layout.scan_layers, layout.decode_layers, kept) == (True, 'scan', on_device)
  decoded = models_given_to_the_decoder(monkeypatch)
  prompts = prompts_of([3, 9, 5], seed=2)
  got = generate(scanned, stacked, prompts, max_new_tokens=8, cache_len=CACHE)
  assert [m.scan_layers for m in decoded] == [False]
  want = generate(model, params, prompts, max_new_tokens=8, cache_len=CACHE)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)
