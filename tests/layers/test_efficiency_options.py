"""Options that change speed, not results: q, k and v by one fused matmul, and the remat policy
that keeps the attention kernel's outputs (so splash's forward runs once, not twice)."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from paxlike.layers import TransformerLM, attention_kernels
from paxlike.layers.lm_checks import REMAT_POLICIES

TOKENS = jax.random.randint(jax.random.key(0), (2, 16), 0, 64, dtype=jnp.int32)


@pytest.mark.parametrize('fields', [dict(num_kv_heads=2), dict(num_kv_heads=4, qkv_bias=True),
                                    dict(num_kv_heads=1, lora_rank=2,
                                         lora_targets=('query', 'key', 'value'))])
def test_fused_qkv_has_the_same_params_logits_and_gradients(fields):
  base = TransformerLM(vocab_size=64, num_layers=2, d_model=32, num_heads=4, d_ff=64, **fields)
  fused = base.clone(fused_qkv=True)
  params = nn.unbox(jax.jit(base.init)(jax.random.key(0), TOKENS))['params']
  fused_shapes = nn.unbox(jax.eval_shape(fused.init, jax.random.key(0), TOKENS))['params']
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(lambda x: x.shape, fused_shapes)

  def loss(model, p):
    logits = model.apply({'params': p}, TOKENS[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, TOKENS[:, 1:]).mean()

  want = jax.jit(jax.value_and_grad(lambda p: loss(base, p)))(params)
  got = jax.jit(jax.value_and_grad(lambda p: loss(fused, p)))(params)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
  for a, b in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)


def _splash_kernels_in_gradient(policy: str) -> list[str]:
  """The splash kernels a rematerialised layer's gradient runs, in order."""
  b, t, n, h = 1, 128, 2, 16

  def layer(x, w):
    q = (x @ w).reshape(b, t, n, h)
    return attention_kernels.splash_attention(q, q, q, None, interpret=True).reshape(b, t, n * h)

  remat = jax.checkpoint(layer, policy=REMAT_POLICIES[policy])
  x, w = jnp.ones((b, t, n * h)), jnp.eye(n * h)
  jaxpr = jax.make_jaxpr(jax.grad(lambda x, w: remat(x, w).sum(), argnums=1))(x, w)
  return re.findall(r'name=(splash_mqa\w+)', str(jaxpr))


def test_dots_attention_keeps_the_splash_forward_and_dots_runs_it_again():
  dots, kept = _splash_kernels_in_gradient('dots'), _splash_kernels_in_gradient('dots_attention')
  forward = lambda names: sum(name.startswith('splash_mqa_fwd') for name in names)
  assert forward(dots) == 2 and forward(kept) == 1
  assert sorted(set(dots)) == sorted(set(kept))  # The same backward kernels either way.
