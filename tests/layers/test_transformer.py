"""Behaviour of TransformerLM: shapes, masking, parameter counts, names, dtypes, training."""

import textwrap

import fiddle as fdl
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from fiddle.experimental import serialization

from paxlike.layers import TransformerLM
from paxlike.layers.attention import apply_rope
from tests.helpers import run_script

TINY = dict(vocab_size=64, num_layers=2, d_model=32, num_heads=4, d_ff=64, max_len=32)
LOGICAL_NAMES = {'vocab', 'embed', 'heads', 'kv_heads', 'kv', 'mlp', None}


def _tokens(seed: int, shape=(2, 16), vocab: int = 64) -> np.ndarray:
  """Random int32 tokens drawn by numpy (jax.random compiles a program per shape)."""
  return np.random.default_rng(seed).integers(0, vocab, shape).astype(np.int32)


def _init(model: TransformerLM, tokens: jax.Array):
  return model.init(jax.random.key(0), tokens)


def _count(variables) -> int:
  return sum(x.size for x in jax.tree.leaves(nn.unbox(variables)))


def _count_abstract(model: TransformerLM, tokens: jax.Array) -> int:
  """Parameter count from shapes only (no compute)."""
  return _count(jax.eval_shape(model.init, jax.random.key(0), tokens))


def expected_params(vocab_size=256, num_layers=2, d_model=128, num_heads=4, num_kv_heads=None,
                    d_ff=512, max_len=256, tied_embeddings=True, use_rmsnorm=True,
                    gated_mlp=True, rope=True, sliding_window=None) -> int:
  """Hand count: embeddings, per-layer attention + MLP + 2 norms, final norm, head."""
  del sliding_window  # no parameters
  head_dim = d_model // num_heads
  kv_heads = num_kv_heads or num_heads
  attn = d_model * num_heads * head_dim * 2 + d_model * kv_heads * head_dim * 2  # q, out; k, v
  mlp = (3 if gated_mlp else 2) * d_model * d_ff
  norm = d_model if use_rmsnorm else 2 * d_model
  total = vocab_size * d_model + num_layers * (attn + mlp + 2 * norm) + norm
  total += 0 if rope else max_len * d_model
  return total + (0 if tied_embeddings else d_model * vocab_size)


VARIANTS = [
    {},
    dict(rope=False, tied_embeddings=False),
    dict(use_rmsnorm=False, gated_mlp=False, num_kv_heads=2),
    dict(sliding_window=3, num_kv_heads=1),
]


@pytest.mark.parametrize('variant', VARIANTS)
def test_shapes_dtypes_and_param_count(variant):
  model = TransformerLM(**TINY, **variant)
  tokens = _tokens(0)
  variables = _init(model, tokens)
  logits = model.apply(variables, tokens)
  assert logits.shape == (2, 16, 64) and logits.dtype == jnp.float32
  assert np.isfinite(np.asarray(logits)).all()
  assert _count(variables) == expected_params(**TINY, **variant)


def test_default_param_count_literal():
  # 256*128 embed + 2 * (4*128*128 attn + 3*128*512 mlp + 2*128 norms) + 128 final norm.
  assert _count_abstract(TransformerLM(), _tokens(0, (1, 8), 256)) == 557_696 == expected_params()


def test_gqa_and_tied_embeddings_change_param_count():
  tokens = _tokens(0)
  full = _count_abstract(TransformerLM(**TINY), tokens)
  gqa = _count_abstract(TransformerLM(**TINY, num_kv_heads=1), tokens)
  untied = _count_abstract(TransformerLM(**TINY, tied_embeddings=False), tokens)
  head_dim = TINY['d_model'] // TINY['num_heads']
  # k and v go from 4 heads to 1 in each layer; untying adds a [d_model, vocab] head.
  assert full - gqa == TINY['num_layers'] * 2 * TINY['d_model'] * 3 * head_dim
  assert untied - full == TINY['d_model'] * TINY['vocab_size']


@pytest.mark.parametrize('variant', [{}, dict(rope=False), dict(num_kv_heads=1, sliding_window=5)])
def test_causal(variant):
  model = TransformerLM(**TINY, **variant)
  tokens = _tokens(1)
  variables = _init(model, tokens)
  logits = model.apply(variables, tokens)
  t = 7
  changed = tokens.copy()
  changed[:, t + 1:] = (tokens[:, t + 1:] + 1) % 64
  logits_changed = model.apply(variables, changed)
  prefix_only = jax.jit(model.apply)(variables, tokens[:, : t + 1])  # One program, not per op.
  np.testing.assert_allclose(logits_changed[:, : t + 1], logits[:, : t + 1], atol=1e-5)
  np.testing.assert_allclose(prefix_only, logits[:, : t + 1], atol=1e-5)
  assert not np.allclose(logits_changed[:, t + 1:], logits[:, t + 1:], atol=1e-3)


def test_sliding_window_limits_receptive_field():
  window, layers = 4, 2
  model = TransformerLM(**{**TINY, 'num_layers': layers}, sliding_window=window)
  tokens = _tokens(2)
  variables = _init(model, tokens)
  logits = model.apply(variables, tokens)
  t = 15
  reach = layers * (window - 1)  # each layer looks window - 1 tokens further back
  outside, inside = tokens.copy(), tokens.copy()
  outside[:, t - reach - 1] += 1
  inside[:, t - reach] += 1
  np.testing.assert_allclose(model.apply(variables, outside)[:, t], logits[:, t], atol=1e-5)
  assert not np.allclose(model.apply(variables, inside)[:, t], logits[:, t], atol=1e-3)


def test_apply_rope_scores_depend_only_on_relative_position():
  q, k = np.random.default_rng(0).standard_normal((2, 1, 1, 1, 16)).astype(np.float32)
  # Jitted: one program for every pair of positions, not one per op.
  score = jax.jit(lambda m, n: jnp.sum(apply_rope(q, jnp.array([m])) *
                                       apply_rope(k, jnp.array([n]))))
  np.testing.assert_allclose(score(3, 1), score(13, 11), rtol=1e-4)
  np.testing.assert_allclose(score(0, 0), np.sum(q.astype(np.float64) * k), rtol=1e-5)
  assert abs(score(3, 1) - score(3, 2)) > 1e-3


def test_rope_of_bfloat16_features_turns_them_by_float32_angles():
  """Far into a sequence a bfloat16 angle is useless (at position 3001 its spacing is 16 rad),
  so the angles and the rotation must be float32 whatever the features' dtype: the output then
  equals a float64 rotation up to bfloat16 rounding of the result."""
  x = np.random.default_rng(7).standard_normal((1, 2, 2, 16)).astype(jnp.bfloat16)
  positions = np.array([3001, 3002])
  out = jax.jit(apply_rope)(x, positions)
  assert out.dtype == jnp.bfloat16
  x64 = np.asarray(x, np.float64)
  half = x64.shape[-1] // 2
  angles = positions[:, None, None] * 10_000.0 ** (-np.arange(half) / half)  # [T, 1, H/2]
  x1, x2 = x64[..., :half], x64[..., half:]
  want = np.concatenate([x1 * np.cos(angles) - x2 * np.sin(angles),
                         x2 * np.cos(angles) + x1 * np.sin(angles)], axis=-1)
  np.testing.assert_allclose(np.asarray(out, np.float64), want, atol=0.02 * np.abs(x64).max())


@pytest.mark.parametrize('rope', [True, False])
def test_rope_is_translation_invariant(rope):
  """With a sliding window, a position only sees a bounded suffix.

  Put the same content after prefixes of different lengths: with rope (no
  absolute position parameter) the logits that only see the shared content
  are identical; with learned absolute positions they are not.
  """
  window, layers = 3, 2
  model = TransformerLM(**{**TINY, 'num_layers': layers}, sliding_window=window, rope=rope)
  # Both rows 16 tokens (the shape the other tests run): the content after 1 token in the
  # first, after 4 in the second, then 3 more (which the causal logits compared never see).
  content = _tokens(3, (12,))
  tokens = np.stack([np.concatenate([_tokens(4, (1,)), content, _tokens(6, (3,))]),
                     np.concatenate([_tokens(5, (4,)), content])])
  variables = _init(model, tokens)
  reach = layers * (window - 1)
  logits = model.apply(variables, tokens)
  logits_a, logits_b = logits[0, 1 + reach:13], logits[1, 4 + reach:]
  assert np.allclose(logits_a, logits_b, atol=1e-4) == rope


def test_bf16_compute_returns_float32_close_to_fp32():
  tokens = _tokens(6)
  fp32 = TransformerLM(**TINY)
  variables = _init(fp32, tokens)
  bf16 = TransformerLM(**TINY, dtype=jnp.bfloat16)
  ref = fp32.apply(variables, tokens)
  out = jax.jit(bf16.apply)(variables, tokens)  # One program, not one per op.
  assert out.dtype == jnp.float32
  params = jax.eval_shape(bf16.init, jax.random.key(0), tokens)  # Dtypes: nothing to compute.
  assert jax.tree.leaves(nn.unbox(params))[0].dtype == jnp.float32
  np.testing.assert_allclose(out, ref, atol=0.1)
  assert float(jnp.mean(jnp.abs(out - ref))) < 0.02


def test_dropout_needs_rng_only_when_not_deterministic():
  model = TransformerLM(**TINY, dropout_rate=0.5)
  tokens = _tokens(7)
  variables = _init(model, tokens)
  plain = TransformerLM(**TINY).apply(variables, tokens)
  np.testing.assert_allclose(model.apply(variables, tokens, deterministic=True), plain)
  noisy = model.apply(variables, tokens, deterministic=False, rngs={'dropout': jax.random.key(1)})
  assert not np.allclose(noisy, plain, atol=1e-3)


def test_invalid_config_raises():
  with pytest.raises(ValueError, match='num_kv_heads'):
    _init(TransformerLM(**TINY, num_kv_heads=3), _tokens(0))
  with pytest.raises(ValueError, match='max_len'):
    _init(TransformerLM(**TINY, rope=False), _tokens(0, (1, 40)))


def test_fiddle_config_round_trips():
  cfg = fdl.Config(TransformerLM, num_kv_heads=1, sliding_window=8, dtype=jnp.bfloat16)
  rebuilt = fdl.build(serialization.load_json(serialization.dump_json(cfg)))
  assert rebuilt == TransformerLM(num_kv_heads=1, sliding_window=8, dtype=jnp.bfloat16)


@pytest.mark.parametrize('variant', VARIANTS)
def test_every_param_has_logical_names(variant):
  variables = _init(TransformerLM(**TINY, **variant), _tokens(0))
  boxes = jax.tree.leaves(variables, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  assert boxes and all(isinstance(b, nn.LogicallyPartitioned) for b in boxes)
  for box in boxes:
    assert len(box.names) == box.value.ndim and set(box.names) <= LOGICAL_NAMES
  specs = nn.get_partition_spec(variables)
  embed = specs['params']['embed']['embedding']
  assert tuple(embed) == ('vocab', 'embed')
  rules = [('mlp', 'model'), ('heads', 'model'), ('vocab', 'model')]
  mesh_specs = nn.logical_to_mesh(specs, rules)
  assert tuple(mesh_specs['params']['block_0']['mlp']['wo']['kernel']) == ('model', None)


def test_training_reduces_loss():
  model = TransformerLM(**TINY)
  seq = np.tile(np.arange(8, dtype=np.int32), 4)[None]  # 0..7 repeated, [1, 32]
  # Initialised on the other tests' token shape: the same params (rope: none depend on length).
  params = nn.unbox(_init(model, _tokens(0)))['params']
  opt = optax.adam(1e-2)

  def loss_fn(p):
    logits = model.apply({'params': p}, seq[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, seq[:, 1:]).mean()

  @jax.jit
  def step(p, state):
    loss, grads = jax.value_and_grad(loss_fn)(p)
    updates, state = opt.update(grads, state, p)
    return optax.apply_updates(p, updates), state, loss

  state = opt.init(params)
  losses = []
  for _ in range(20):
    params, state, loss = step(params, state)
    losses.append(float(loss))
  assert losses[-1] < 0.25 * losses[0]


SHARDED_SCRIPT = textwrap.dedent("""
    import flax.linen as nn, jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    from paxlike.layers import TransformerLM
    assert jax.device_count() == 8
    mesh = jax.make_mesh((4, 2), ('data', 'model'), axis_types=(AxisType.Auto,) * 2)
    rules = [('batch', 'data'), ('mlp', 'model'), ('heads', 'model'), ('kv_heads', 'model'),
             ('vocab', 'model'), ('embed', None), ('kv', None), ('length', None)]
    model = TransformerLM(vocab_size=64, d_model=32, num_heads=4, num_kv_heads=2, d_ff=64)
    tokens = jax.random.randint(jax.random.key(1), (8, 16), 0, 64, dtype=jnp.int32)
    boxed = jax.jit(model.init)(jax.random.key(0), tokens)
    params = nn.unbox(boxed)
    ref = jax.jit(model.apply)(params, tokens)
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules)
    tokens = jax.device_put(tokens, NamedSharding(mesh, P('data', None)))
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      init = jax.jit(lambda k, t: nn.unbox(model.init(k, t)), out_shardings=shardings)
      sharded = init(jax.random.key(0), tokens)
      apply = jax.jit(model.apply)
      assert 'sharding_constraint' in apply.lower(sharded, tokens).as_text()
      out = apply(sharded, tokens)
    wo = sharded['params']['block_0']['mlp']['wo']['kernel']
    assert wo.sharding.spec == P('model', None), wo.sharding
    for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(params)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    assert out.sharding.spec[0] == 'data', out.sharding
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5, rtol=1e-5)
    print('SHARDED_OK')
""")


def test_sharded_apply_matches_single_device():
  assert 'SHARDED_OK' in run_script(SHARDED_SCRIPT, timeout=120)
