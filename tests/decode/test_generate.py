"""The KV-cache decoder against a full recompute of the growing sequence, batched against one
prompt at a time, stopping at EOS, and the requests it refuses."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.decode import engine, generate
from paxlike.errors import UserError
from paxlike.layers import TransformerLM, stack_layers

TINY = dict(vocab_size=64, num_layers=2, d_model=32, num_heads=4, d_ff=64, max_len=64)
VARIANTS = {
    'default': {},
    'gqa_qknorm_untied': dict(num_kv_heads=2, qk_norm=True, tied_embeddings=False),
    'window_mqa': dict(sliding_window=5, num_kv_heads=1),
    'learned_positions': dict(rope=False, use_rmsnorm=False, gated_mlp=False),
    'scanned_remat': dict(scan_layers=True, num_kv_heads=2, remat_policy='full'),  # Unrolled.
    'scanned_by_scan': dict(scan_layers=True, num_kv_heads=2, decode_layers='scan'),
}


def params_of(model: TransformerLM, seed: int = 0):
  unrolled = model.clone(scan_layers=False)
  params = nn.unbox(unrolled.init(jax.random.key(seed), jnp.zeros((1, 4), jnp.int32)))['params']
  # Larger weights than the init's make confident, well-separated greedy choices.
  params = jax.tree.map(lambda x: x * 2.0, params)
  return stack_layers(params, model.num_layers) if model.scan_layers else params


def recompute_greedy(model: TransformerLM, params, prompt: np.ndarray, steps: int) -> np.ndarray:
  """The reference: the whole model (no cache) rerun on the growing sequence for every new
  token. The sequence sits left-aligned in a fixed `max_len` window, so one compiled forward
  pass serves every length (causal attention: what follows a token cannot change it)."""
  forward = _forward(model)
  tokens = list(prompt)
  for _ in range(steps):
    window = np.zeros(model.max_len, np.int32)
    window[:len(tokens)] = tokens
    tokens.append(int(np.argmax(forward(params, window)[len(tokens) - 1])))
  return np.asarray(tokens[len(prompt):], np.int32)


@functools.cache  # One jitted forward per model, reused across prompts and params.
def _forward(model: TransformerLM):
  return jax.jit(lambda p, window: model.apply({'params': p}, window[None])[0])


def prompts_of(lengths, seed: int = 0, vocab: int = 64) -> list[np.ndarray]:
  rng = np.random.default_rng(seed)
  return [rng.integers(0, vocab, n).astype(np.int32) for n in lengths]


@pytest.mark.parametrize('variant', VARIANTS)
def test_kv_cache_greedy_equals_full_recompute_token_for_token(variant):
  model = TransformerLM(**TINY, **VARIANTS[variant])
  params = params_of(model)
  prompts = prompts_of([7, 3])
  got = generate(model, params, prompts, max_new_tokens=20)
  for prompt, tokens in zip(prompts, got):
    np.testing.assert_array_equal(tokens, recompute_greedy(model, params, prompt, 20))


def _with_lora_b(params, fn):
  """`params` with every LoRA B replaced by fn(B)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: fn(x) if str(path[-1].key).endswith('_lora_b') else x, params)


def test_a_lora_model_decodes_with_its_adapters():
  model = TransformerLM(**TINY, lora_rank=2, lora_targets=('query', 'value', 'wo'))
  params = _with_lora_b(params_of(model), lambda b: b + 0.3)
  [prompt] = prompts_of([6], seed=9)
  [got] = generate(model, params, [prompt], max_new_tokens=12)
  np.testing.assert_array_equal(got, recompute_greedy(model, params, prompt, 12))
  without = _with_lora_b(params, jnp.zeros_like)  # The adapters change the tokens.
  assert not np.array_equal(got, recompute_greedy(model, without, prompt, 12))


def test_a_decode_past_128_slots_equals_full_recompute():
  # A 120-token prompt plus 16 new tokens needs 135 slots: one 256-slot cache from the start.
  model = TransformerLM(**{**TINY, 'max_len': 256}, num_kv_heads=2)
  params = params_of(model, seed=1)
  assert engine.shapes_for(120, 16, 256) == (256, 128)
  [prompt] = prompts_of([120], seed=2)
  [got] = generate(model, params, [prompt], max_new_tokens=16)
  np.testing.assert_array_equal(got, recompute_greedy(model, params, prompt, 16))


def test_the_cache_and_prompt_width_are_the_smallest_buckets_that_fit():
  # (cache size, prompt width): the cache doubles from 128 (capped at cache_len) to hold the
  # prompt and its new tokens, less one; the width doubles from 16 within what is left.
  assert engine.shapes_for(32, 256, 2048) == (512, 32)
  assert engine.shapes_for(5, 32, 2048) == (128, 16)
  assert engine.shapes_for(20, 100, 2048) == (128, 29)  # 32 would leave 99 slots, not 100.
  assert engine.shapes_for(32, 257, 288) == (288, 32)
  assert engine.shapes_for(5, 40, 64) == (64, 16)
  assert engine.shapes_for(60, 5, 64) == (64, 60)


@pytest.mark.parametrize('scan', [False, True])
def test_a_ragged_batch_decodes_as_each_prompt_alone(scan):
  model = TransformerLM(**TINY, num_kv_heads=2, scan_layers=scan)
  params = params_of(model, seed=3)
  prompts = prompts_of([9, 1, 5, 12], seed=4)
  batched = generate(model, params, prompts, max_new_tokens=15)
  for prompt, tokens in zip(prompts, batched):
    [alone] = generate(model, params, [prompt], max_new_tokens=15)
    np.testing.assert_array_equal(tokens, alone)


def test_rows_stop_after_their_eos_and_the_loop_stops_when_all_have():
  model = TransformerLM(**TINY)
  params = params_of(model, seed=5)
  prompts = prompts_of([4, 6, 5], seed=6)
  free = generate(model, params, prompts, max_new_tokens=24)
  eos = int(free[0][3])  # Row 0 produces this token at step 3 (perhaps earlier too).
  stopped = generate(model, params, prompts, max_new_tokens=24, eos_id=eos)
  for row, full in zip(stopped, free):
    hits = np.flatnonzero(full == eos)
    expected = full[:hits[0] + 1] if len(hits) else full
    np.testing.assert_array_equal(row, expected)
  # With EOS everywhere at once, the loop ends right after the first token.
  run = engine.decoder(model, engine.Options(64, eos_id=int(free[0][0])))
  tokens, lengths = engine.left_pad(prompts[:1], 0)
  state = run.prefill(params, tokens, lengths, np.ones(1, bool), jax.random.key(0))
  assert int(run.loop(params, state, np.int32(24)).count) == 1


def test_requests_that_cannot_be_decoded_are_user_errors():
  model = TransformerLM(**TINY)
  params = params_of(model)
  ok = prompts_of([4])
  with pytest.raises(UserError, match='needs 69 cache slots, but cache_len is 64'):
    generate(model, params, prompts_of([60]), max_new_tokens=10)
  with pytest.raises(UserError, match='prompt 1 is empty'):
    generate(model, params, ok + [np.zeros(0, np.int32)], max_new_tokens=2)
  with pytest.raises(UserError, match='outside the model vocabulary'):
    generate(model, params, [np.asarray([3, 64])], max_new_tokens=2)
  with pytest.raises(UserError, match=r'top_p must be in \(0, 1\]'):
    generate(model, params, ok, max_new_tokens=2, temperature=1.0, top_p=0.0)
  with pytest.raises(UserError, match='no prompts'):
    generate(model, params, [], max_new_tokens=2)
  learned = TransformerLM(**TINY, rope=False)
  with pytest.raises(UserError, match='exceeds max_len=64'):
    generate(learned, params_of(learned), ok, max_new_tokens=2, cache_len=80)
