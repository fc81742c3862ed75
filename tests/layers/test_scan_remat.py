"""Scan over layers and rematerialisation: same logits, same gradients, params on a 'layers' axis."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import ad_checkpoint

from paxlike.layers import TransformerLM
from paxlike.layers.transformer import stack_layers, unstack_layers

TINY = dict(vocab_size=64, num_layers=3, d_model=32, num_heads=4, d_ff=64)
TOKENS = jax.random.randint(jax.random.key(0), (2, 16), 0, 64, dtype=jnp.int32)
VARIANTS = {
    'default': {},
    'gqa_untied_qknorm': dict(num_kv_heads=2, tied_embeddings=False, qk_norm=True),
    'geglu_window': dict(mlp_activation='gelu', sliding_window=4, num_kv_heads=1),
    'layernorm_abs_pos': dict(use_rmsnorm=False, gated_mlp=False, rope=False, max_len=16),
}


def _params(model: TransformerLM):
  return nn.unbox(model.init(jax.random.key(0), TOKENS))['params']


def _logits(model: TransformerLM, params) -> jax.Array:
  return model.apply({'params': params}, TOKENS)


def _loss(model: TransformerLM, params, tokens=TOKENS) -> jax.Array:
  logits = model.apply({'params': params}, tokens[:, :-1])
  return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


@pytest.mark.parametrize('variant', VARIANTS)
def test_scan_and_unrolled_give_same_logits(variant):
  unrolled = TransformerLM(**TINY, **VARIANTS[variant])
  scanned = unrolled.clone(scan_layers=True)
  params = _params(unrolled)
  stacked = stack_layers(params, TINY['num_layers'])
  # The restacked tree has exactly the scanned model's structure and shapes.
  scan_shapes = jax.eval_shape(lambda: _params(scanned))
  assert jax.tree.map(lambda x: x.shape, stacked) == jax.tree.map(lambda x: x.shape, scan_shapes)
  np.testing.assert_allclose(_logits(scanned, stacked), _logits(unrolled, params),
                             atol=2e-5, rtol=1e-5)
  assert jax.tree.all(jax.tree.map(np.array_equal, unstack_layers(stacked), params))


def test_scanned_params_carry_a_layers_axis():
  boxed = TransformerLM(**TINY, num_kv_heads=2, scan_layers=True).init(jax.random.key(0), TOKENS)
  blocks = boxed['params']['blocks']
  assert set(blocks) == {'attention', 'attn_norm', 'mlp', 'mlp_norm'}
  query = blocks['attention']['query']
  assert query.names == ('layers', 'embed', 'heads', 'kv') and query.value.shape == (3, 32, 4, 8)
  assert blocks['mlp']['wo']['kernel'].names == ('layers', 'mlp', 'embed')
  assert blocks['attn_norm']['scale'].names == ('layers', 'embed')
  assert boxed['params']['embed']['embedding'].names == ('vocab', 'embed')
  # Each layer is initialised independently.
  q = np.asarray(query.value)
  assert not np.allclose(q[0], q[1])


@pytest.mark.parametrize('scan,policies', [(True, ('none', 'full', 'dots', 'dots_attention')),
                                           (False, ('none', 'dots'))])
def test_remat_policies_give_same_gradients(scan, policies):
  base = TransformerLM(**TINY, num_kv_heads=2, scan_layers=scan)
  params = _params(base)
  grads = {}
  for policy in policies:
    model = base.clone(remat_policy=policy)
    grad_fn = jax.jit(jax.value_and_grad(lambda p, m=model: _loss(m, p)))
    grads[policy] = grad_fn(params)
    jaxpr = str(jax.make_jaxpr(grad_fn)(params))
    assert ('remat' in jaxpr or 'checkpoint' in jaxpr) == (policy != 'none'), policy
  for policy in policies[1:]:
    np.testing.assert_allclose(grads[policy][0], grads['none'][0], rtol=1e-6)
    for a, b in zip(jax.tree.leaves(grads[policy][1]), jax.tree.leaves(grads['none'][1])):
      np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)


def test_dots_policy_saves_fewer_residuals_than_none_and_more_than_full(capsys):
  """'dots' keeps the weight matmuls' outputs for the backward pass, 'full' keeps only inputs."""
  counts = {}
  for policy in ('none', 'dots', 'full'):
    model = TransformerLM(**TINY, remat_policy=policy)
    params = jax.eval_shape(lambda m=model: _params(m))
    ad_checkpoint.print_saved_residuals(lambda p, m=model: _loss(m, p), params)
    lines = capsys.readouterr().out.splitlines()
    counts[policy] = len(lines)
    if policy == 'dots':
      assert any('dot_general' in line for line in lines)
  assert counts['full'] < counts['dots'] < counts['none'], counts


def test_dropout_under_scan_differs_per_call_and_is_reproducible():
  model = TransformerLM(**TINY, dropout_rate=0.3, scan_layers=True, remat_policy='full')
  params = _params(model)
  run = jax.jit(lambda p, key: model.apply({'params': p}, TOKENS, deterministic=False,
                                           rngs={'dropout': key}))
  np.testing.assert_array_equal(run(params, jax.random.key(1)), run(params, jax.random.key(1)))
  assert not np.allclose(run(params, jax.random.key(1)), run(params, jax.random.key(2)), atol=1e-3)
  assert not np.allclose(run(params, jax.random.key(1)), _logits(model, params), atol=1e-3)
