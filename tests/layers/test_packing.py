"""Packed documents: with segment ids and restarting positions, each document's logits equal its
logits alone (XLA; splash in Pallas' interpreter), for GQA, sliding windows, rope and learned
positions, scanned or not."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.layers import TransformerLM, attention_kernels
from paxlike.layers.attention import apply_rope

TINY = dict(vocab_size=64, num_layers=2, d_model=32, num_heads=4, d_ff=64, max_len=128)
VARIANTS = {
    'default': {},
    'gqa_qknorm': dict(num_kv_heads=2, qk_norm=True),
    'window': dict(sliding_window=3, num_kv_heads=1),
    'learned_positions': dict(rope=False, tied_embeddings=False),
    'scanned': dict(scan_layers=True, num_kv_heads=2, remat_policy='full'),
}


def pack(docs: list[list[int]], seq_len: int) -> tuple[np.ndarray, ...]:
  """(tokens, segment_ids, positions) [len(docs), seq_len]: the documents of each row, one
  after another, padded with zeros."""
  rows = len(docs)
  tokens, segments, positions = (np.zeros((rows, seq_len), np.int32) for _ in range(3))
  for r, row in enumerate(docs):
    start = 0
    for s, doc in enumerate(row):
      end = start + len(doc)
      tokens[r, start:end], segments[r, start:end] = doc, s + 1
      positions[r, start:end] = np.arange(len(doc))
      start = end
  return tokens, segments, positions


def _docs(lengths: list[list[int]], seed: int = 0) -> list[list[np.ndarray]]:
  rng = np.random.default_rng(seed)
  return [[rng.integers(1, 64, n).astype(np.int32) for n in row] for row in lengths]


def _check_packed_equals_alone(model, params, docs, seq_len, atol=2e-5):
  """Each document's logits in its packed row equal its logits alone: each document as a row of
  its own from position 0, zeros after its end (which a causal model does not see), all in one
  batch so that one program serves every length."""
  tokens, segments, positions = pack(docs, seq_len)
  packed = jax.jit(model.apply)({'params': params}, jnp.asarray(tokens),
                                segment_ids=jnp.asarray(segments), positions=jnp.asarray(positions))
  flat = [doc for row in docs for doc in row]
  alone = jax.jit(model.clone(attention_impl='xla').apply)(
      {'params': params}, jnp.asarray(pack([[doc] for doc in flat], seq_len)[0]))
  i = 0
  for r, row in enumerate(docs):
    start = 0
    for doc in row:
      np.testing.assert_allclose(packed[r, start:start + len(doc)], alone[i, :len(doc)],
                                 atol=atol, rtol=1e-5)
      start, i = start + len(doc), i + 1
  return packed


@pytest.mark.parametrize('variant', VARIANTS)
def test_packed_document_logits_equal_the_document_alone(variant):
  model = TransformerLM(**TINY, **VARIANTS[variant])
  docs = _docs([[5, 9, 3], [12, 7]])
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 24), jnp.int32)))['params']
  packed = _check_packed_equals_alone(model, params, docs, 24)
  # The same tokens without segment ids see their neighbours: the test can tell.
  tokens, _, _ = pack(docs, 24)
  plain = jax.jit(model.apply)({'params': params}, jnp.asarray(tokens))
  assert not np.allclose(plain[0, 5:14], packed[0, 5:14], atol=1e-3)


def test_padding_rows_stay_finite_and_segment_none_is_bitwise_todays_path():
  model = TransformerLM(**TINY, num_kv_heads=2)
  tokens, segments, positions = pack(_docs([[4], [3, 2]]), 16)
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), jnp.asarray(tokens)))['params']
  apply = jax.jit(model.apply)
  out = apply({'params': params}, jnp.asarray(tokens), segment_ids=jnp.asarray(segments),
              positions=jnp.asarray(positions))
  assert np.isfinite(np.asarray(out)).all()
  default = apply({'params': params}, jnp.asarray(tokens))
  explicit = apply({'params': params}, jnp.asarray(tokens), segment_ids=None, positions=None)
  np.testing.assert_array_equal(np.asarray(default), np.asarray(explicit))


def test_learned_positions_are_gathered_per_row():
  model = TransformerLM(**TINY, rope=False)
  tokens = jnp.asarray(_docs([[6], [6]])[0][0])[None].repeat(2, axis=0)
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), tokens))['params']
  apply = jax.jit(model.apply)
  positions = jnp.asarray([np.arange(6), np.arange(6) + 9])
  out = apply({'params': params}, tokens, positions=positions)
  np.testing.assert_allclose(out[0], apply({'params': params}, tokens[:1])[0], atol=1e-6)
  shifted = params['pos_embed'][9:15]
  moved = {**params, 'pos_embed': params['pos_embed'].at[:6].set(shifted)}
  np.testing.assert_allclose(out[1], apply({'params': moved}, tokens[:1])[0], atol=1e-6)


def test_rope_with_per_row_positions_rotates_each_row_by_its_own_positions():
  x = jax.random.normal(jax.random.key(0), (2, 5, 3, 8))
  positions = jnp.asarray([[0, 1, 2, 0, 1], [7, 8, 9, 10, 11]])
  got = apply_rope(x, positions)
  for r in range(2):
    np.testing.assert_array_equal(got[r], apply_rope(x[r:r + 1], positions[r])[0])
  assert not np.allclose(got[0], apply_rope(x, jnp.arange(5))[0])


def _interpreted_splash(monkeypatch):
  """The model's attention resolved to splash, run in Pallas' interpreter (CPU)."""
  monkeypatch.setattr(attention_kernels, 'resolve',
                      lambda impl, **_: 'splash' if impl == 'splash' else 'xla')
  monkeypatch.setattr(attention_kernels, 'attend',
                      functools.partial(attention_kernels.attend, interpret=True))


@pytest.mark.parametrize('variant', ['gqa_qknorm', 'window', 'learned_positions'])
def test_packed_documents_with_the_splash_kernel_equal_each_document_alone(monkeypatch, variant):
  model = TransformerLM(**{**TINY, 'num_layers': 1}, **VARIANTS[variant], attention_impl='splash')
  docs = _docs([[40, 50, 30], [128]], seed=1)
  params = nn.unbox(jax.jit(model.clone(attention_impl='xla').init)(
      jax.random.key(0), jnp.zeros((1, 128), jnp.int32)))['params']
  _interpreted_splash(monkeypatch)
  _check_packed_equals_alone(model, params, docs, 128)


def test_splash_kernel_with_segment_ids_equals_xla_with_them():
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (2, 256, 4, 16))
  k, v = (jax.random.normal(key, (2, 256, 2, 16)) for key in keys[1:])
  segments = jnp.asarray(pack([[np.ones(100), np.ones(90)], [np.ones(256)]], 256)[1])
  for window in (None, 30):
    got = attention_kernels.splash_attention(q, k, v, window, interpret=True,
                                             segment_ids=segments)
    want = attention_kernels.attend(q, k, v, 'xla', window, segment_ids=segments)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    alone = attention_kernels.attend(q[:1, 100:190], k[:1, 100:190], v[:1, 100:190], 'xla',
                                     window)
    np.testing.assert_allclose(want[:1, 100:190], alone, atol=1e-6, rtol=1e-6)


def test_cudnn_gets_the_same_segment_mask_as_xla(monkeypatch):
  """cuDNN cannot run on CPU: its call must carry the mask XLA's (tested) call carries."""
  calls = []
  monkeypatch.setattr(jax.nn, 'dot_product_attention', lambda *a, **k: calls.append(k) or a[0])
  segments = jnp.asarray([[1, 1, 2, 0]])
  q = jnp.zeros((1, 4, 2, 8))
  for kernel in ('xla', 'cudnn'):
    attention_kernels.attend(q, q, q, kernel, 3, segment_ids=segments)
  xla, cudnn = calls
  assert cudnn['implementation'] == 'cudnn' and cudnn['is_causal']
  assert cudnn['local_window_size'] == xla['local_window_size'] == (2, 0)
  want = np.array([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], bool)
  np.testing.assert_array_equal(cudnn['mask'][0, 0], want)
  np.testing.assert_array_equal(xla['mask'], cudnn['mask'])
