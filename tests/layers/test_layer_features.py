"""Each layer feature of the model families against an independent float64 numpy formula
(tests/layers/attention_reference.py, rope_reference.py), each test also showing that the
wrong variant (the other order, the other layer kind, the other rounding) differs:

- the embedding scale (Gemma: × sqrt(d_model) rounded to the compute dtype first);
- q/k-norm before RoPE (Qwen 3, Gemma 3);
- which layers are global and which local (sliding window, local RoPE base), per layer;
- the attention logit soft-cap against the causal and decode masks (cap, then mask);
- the final logit soft-cap.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from paxlike.layers import TransformerLM
from paxlike.layers.attention import CausalSelfAttention
from paxlike.layers.blocks import DecoderBlock
from paxlike.layers.rope import RopeScaling
from tests.layers import attention_reference as ref
from tests.layers import rope_reference

B, T, D = 2, 10, 16
X = np.random.default_rng(0).standard_normal((B, T, D)).astype(np.float32)
POSITIONS = np.arange(T)


def perturbed(params, seed: int = 1):
  """Params moved off their init (norm scales start at one or zero, B of LoRA at zero)."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: np.asarray(x) + 0.3 * rng.standard_normal(x.shape).astype(
      np.asarray(x).dtype), params)


def layer_and_params(**fields) -> tuple[CausalSelfAttention, dict]:
  layer = CausalSelfAttention(num_heads=4, num_kv_heads=2, head_dim=8, implementation='xla',
                              **fields)
  params = nn.unbox(layer.init(jax.random.key(0), jnp.asarray(X))['params'])
  return layer, perturbed(params)


def assert_close(got, want) -> None:
  np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-4, atol=1e-5)


def differs(a, b) -> bool:
  return float(np.max(np.abs(np.asarray(a, np.float64) - b))) > 1e-3


@pytest.mark.parametrize('offset', [0.0, 1.0])
def test_qk_norm_comes_before_rope(offset):
  layer, params = layer_and_params(qk_norm=True, norm_eps=1e-6, rope_base=100.0,
                                   norm_weight_offset=offset)
  got = layer.apply({'params': params}, jnp.asarray(X))
  inv_freq = rope_reference.default(8, 100.0)
  kwargs = dict(qk_norm_eps=1e-6, norm_offset=offset)
  assert_close(got, ref.self_attention(X.astype(np.float64), params, POSITIONS, inv_freq,
                                       **kwargs))
  assert differs(got, ref.self_attention(X.astype(np.float64), params, POSITIONS, inv_freq,
                                         norm_after_rope=True, **kwargs))


def mask_then_cap(q, k, v, mask, scale, softcap):
  """The wrong order: a masked score set very low, then capped to -cap (so it gets weight)."""
  groups = q.shape[2] // k.shape[2]
  k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
  scores = np.where(mask[None, None], np.einsum('btnh,bsnh->bnts', q, k) * scale, -1e30)
  weights = np.exp(softcap * np.tanh(scores / softcap))
  return np.einsum('bnts,bsnh->btnh', weights / weights.sum(-1, keepdims=True), v)


def decoded(layer, params, prefill: int, cache_len: int) -> np.ndarray:
  """The layer's outputs for X when decoding: `prefill` tokens at once, then one at a time."""
  x, out, cache = jnp.asarray(X), [], {}
  for start, stop in [(0, prefill)] + [(i, i + 1) for i in range(prefill, T)]:
    positions = jnp.broadcast_to(jnp.arange(start, stop), (B, stop - start))
    y, variables = layer.apply({'params': params, **cache}, x[:, start:stop],
                               positions=positions, decode=True, cache_len=cache_len,
                               mutable=['cache'])
    cache = {'cache': variables['cache']}
    out.append(np.asarray(y))
  return np.concatenate(out, axis=1)


@pytest.mark.parametrize('window', [None, 3])
def test_the_soft_cap_comes_before_the_causal_and_the_decode_masks(window, monkeypatch):
  """Training (the causal mask), and decoding into a longer cache (its empty slots masked too;
  a windowed layer's ring of `window` slots): the reference caps the scores, then masks."""
  layer, params = layer_and_params(attn_logit_softcap=1.0, sliding_window=window,
                                   rope_base=100.0, query_scale=0.5)
  x64, inv_freq = X.astype(np.float64), rope_reference.default(8, 100.0)
  want = ref.self_attention(x64, params, POSITIONS, inv_freq, window=window, scale=0.5,
                            softcap=1.0)
  assert_close(layer.apply({'params': params}, jnp.asarray(X)), want)
  assert_close(decoded(layer, params, prefill=4, cache_len=16), want)
  monkeypatch.setattr(ref, 'attend', mask_then_cap)
  wrong = ref.self_attention(x64, params, POSITIONS, inv_freq, window=window, scale=0.5,
                             softcap=1.0)
  assert differs(want, wrong)


def recorded_attention(model: TransformerLM, params: dict, tokens: np.ndarray) -> dict:
  """{layer index: (input, output)} of each layer's attention in an unrolled forward pass."""
  seen = {}

  def record(call, args, kwargs, context):
    out = call(*args, **kwargs)
    module = context.module
    if isinstance(module, CausalSelfAttention) and context.method_name == '__call__':
      seen[int(module.parent.name.removeprefix('block_'))] = (np.asarray(args[0], np.float64),
                                                              np.asarray(out, np.float64))
    return out

  with nn.intercept_methods(record):
    model.apply({'params': params}, jnp.asarray(tokens))
  return seen


# (num_layers, global_every) as Gemma 2 (every 2nd global), a Gemma 3-like pattern (every 3rd;
# Gemma 3's is every 6th) and Mistral (global_every=0: every layer local).
@pytest.mark.parametrize('layers, every', [(4, 2), (6, 3), (3, 0)])
def test_which_layers_are_global_and_what_each_kind_computes(layers, every):
  """transformers' layer types: layer i is 'full_attention' iff (i + 1) % pattern == 0 (none
  without a pattern), else 'sliding_attention' with the window and the local RoPE base."""
  model = TransformerLM(vocab_size=50, num_layers=layers, d_model=D, num_heads=4, head_dim=8,
                        num_kv_heads=2, d_ff=24, max_len=32, sliding_window=3,
                        global_every=every, local_rope_base=10.0, rope_base=10_000.0,
                        rope_scaling=RopeScaling('linear', 2.0), query_scale=0.4,
                        attention_impl='xla')
  tokens = np.random.default_rng(2).integers(0, 50, (B, T))
  params = perturbed(nn.unbox(model.init(jax.random.key(0), jnp.asarray(tokens))['params']))
  seen = recorded_attention(model, params, tokens)
  kinds = {'full_attention': dict(window=None, inv_freq=rope_reference.linear(8, 10_000.0, 2.0)),
           'sliding_attention': dict(window=3, inv_freq=rope_reference.default(8, 10.0))}
  for i in range(layers):
    kind = 'full_attention' if every and (i + 1) % every == 0 else 'sliding_attention'
    other = 'sliding_attention' if kind == 'full_attention' else 'full_attention'
    x, got = seen[i]
    p = params[f'block_{i}']['attention']
    assert_close(got, ref.self_attention(x, p, POSITIONS, scale=0.4, **kinds[kind]))
    assert differs(got, ref.self_attention(x, p, POSITIONS, scale=0.4, **kinds[other]))


@pytest.mark.parametrize('dtype', [jnp.bfloat16, jnp.float32])
def test_the_embedding_scale_is_sqrt_d_model_rounded_to_the_compute_dtype(dtype):
  """Gemma: hidden · normalizer with normalizer = sqrt(hidden_size) as a tensor of the
  hidden states' dtype, so in bfloat16 sqrt(48) = 6.928... is 6.9375."""
  model = TransformerLM(vocab_size=50, num_layers=1, d_model=48, num_heads=4, d_ff=24,
                        max_len=32, scale_embeddings=True, dtype=dtype, attention_impl='xla')
  tokens = np.random.default_rng(3).integers(0, 50, (B, T))
  params = nn.unbox(model.init(jax.random.key(0), jnp.asarray(tokens))['params'])
  entered = {}

  def record(call, args, kwargs, context):
    if isinstance(context.module, DecoderBlock) and context.method_name == '__call__':
      entered['x'] = np.asarray(args[0])
    return call(*args, **kwargs)

  with nn.intercept_methods(record):
    model.apply({'params': params}, jnp.asarray(tokens))
  rows = np.asarray(params['embed']['embedding'])[tokens].astype(dtype)
  normalizer = np.asarray(48**0.5, dtype)
  want = (rows.astype(np.float64) * np.float64(normalizer)).astype(dtype)
  assert entered['x'].dtype == np.dtype(dtype)
  np.testing.assert_array_equal(entered['x'], want)
  if dtype == jnp.bfloat16:
    assert float(normalizer) == 6.9375
    unrounded = (rows.astype(np.float64) * 48**0.5).astype(ml_dtypes.bfloat16)
    assert not np.array_equal(entered['x'], unrounded)


def test_the_final_logit_soft_cap():
  fields = dict(vocab_size=50, num_layers=1, d_model=D, num_heads=4, d_ff=24, max_len=32,
                attention_impl='xla')
  tokens = jnp.asarray(np.random.default_rng(4).integers(0, 50, (B, T)))
  plain = TransformerLM(**fields)
  params = perturbed(nn.unbox(plain.init(jax.random.key(0), tokens)['params']))
  uncapped = np.asarray(plain.apply({'params': params}, tokens), np.float64)
  capped = TransformerLM(**fields, final_logit_softcap=0.5).apply({'params': params}, tokens)
  np.testing.assert_allclose(np.asarray(capped), 0.5 * np.tanh(uncapped / 0.5), rtol=1e-5,
                             atol=1e-6)
  assert np.abs(uncapped).max() > 1.0  # The cap bites.
