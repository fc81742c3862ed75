"""TransformerLM options added for the model zoo: QK-norm, GeGLU, norm epsilon, fused attention."""

import fiddle as fdl
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fiddle.experimental import serialization

from paxlike.errors import UserError
from paxlike.layers import TransformerLM
from paxlike.layers import attention as attention_lib
from paxlike.layers.transformer import Mlp

TINY = dict(vocab_size=64, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, d_ff=64)
TOKENS = jax.random.randint(jax.random.key(0), (2, 16), 0, 64, dtype=jnp.int32)


def _params(model: TransformerLM):
  return nn.unbox(model.init(jax.random.key(0), TOKENS))['params']


def test_qk_norm_params_and_scale_invariance():
  model = TransformerLM(**TINY, qk_norm=True)
  boxed = model.init(jax.random.key(0), TOKENS)['params']
  attn = boxed['block_0']['attention']
  for name in ('query_norm', 'key_norm'):
    assert attn[name]['scale'].names == ('kv',) and attn[name]['scale'].value.shape == (8,)
  params = nn.unbox(boxed)
  plain = TransformerLM(**TINY)
  assert not np.allclose(model.apply({'params': params}, TOKENS),
                         plain.apply({'params': _params(plain)}, TOKENS), atol=1e-3)
  # Normalised queries and keys: scaling their projections leaves the logits unchanged.
  scaled = jax.tree.map(lambda x: x, params)
  for i in range(2):
    a = scaled[f'block_{i}']['attention']
    a['query'], a['key'] = a['query'] * 7.0, a['key'] * 0.2
  np.testing.assert_allclose(model.apply({'params': scaled}, TOKENS),
                             model.apply({'params': params}, TOKENS), atol=1e-4)


@pytest.mark.parametrize('gated,activation,expected', [
    (True, None, 'swiglu'), (True, 'gelu', 'geglu'), (False, None, 'gelu'), (False, 'silu', 'silu'),
])
def test_mlp_activation_choices(gated, activation, expected):
  model = TransformerLM(**TINY, gated_mlp=gated, mlp_activation=activation)
  params = _params(model)
  mlp = params['block_0']['mlp']
  x = jax.random.normal(jax.random.key(1), (2, 5, 32))
  out = Mlp(64, gated, activation=model.mlp_activation or ('silu' if gated else 'gelu')).apply(
      {'params': mlp}, x)
  act = nn.silu if expected in ('swiglu', 'silu') else nn.gelu
  if gated:
    h = act(x @ mlp['wi_gate']['kernel']) * (x @ mlp['wi_up']['kernel'])
  else:
    h = act(x @ mlp['wi']['kernel'])
  np.testing.assert_allclose(out, h @ mlp['wo']['kernel'], atol=1e-5)


def test_invalid_choices_are_clear_errors():
  with pytest.raises(ValueError, match="mlp_activation must be one of.*'relu'"):
    TransformerLM(**TINY, mlp_activation='relu').init(jax.random.key(0), TOKENS)
  with pytest.raises(ValueError, match="remat_policy must be one of.*'some'"):
    TransformerLM(**TINY, remat_policy='some').init(jax.random.key(0), TOKENS)


def test_norm_eps_is_used():
  base = TransformerLM(**TINY)
  params = _params(base)
  big_eps = TransformerLM(**TINY, norm_eps=10.0)
  assert not np.allclose(base.apply({'params': params}, TOKENS),
                         big_eps.apply({'params': params}, TOKENS), atol=1e-3)


def test_attention_on_cpu_asks_jax_for_xla_attention_with_the_window(monkeypatch):
  calls = []
  real = jax.nn.dot_product_attention

  def spy(*args, **kwargs):
    calls.append(kwargs)
    return real(*args, **kwargs)

  monkeypatch.setattr(jax.nn, 'dot_product_attention', spy)
  TransformerLM(**TINY, sliding_window=4).init(jax.random.key(0), TOKENS)
  assert calls and all(c['implementation'] == 'xla' and c['is_causal'] for c in calls)
  assert calls[0]['local_window_size'] == (3, 0)


def test_new_fields_round_trip_through_fiddle():
  cfg = fdl.Config(TransformerLM, qk_norm=True, mlp_activation='gelu', norm_eps=1e-5,
                   scan_layers=True, remat_policy='dots', dtype=jnp.bfloat16)
  rebuilt = fdl.build(serialization.load_json(serialization.dump_json(cfg)))
  assert rebuilt == fdl.build(cfg)


def test_attention_impl_auto_is_the_default_and_is_xla_on_cpu_and_bad_names_are_rejected():
  assert TransformerLM.__dataclass_fields__['attention_impl'].default == 'auto'
  assert attention_lib.CausalSelfAttention.__dataclass_fields__['implementation'].default == 'auto'
  assert TransformerLM(**TINY).attention_kernel(16) == 'xla'  # This suite runs on CPU.
  params = _params(TransformerLM(**TINY))
  default = TransformerLM(**TINY).apply({'params': params}, TOKENS)
  xla = TransformerLM(**TINY, attention_impl='xla').apply({'params': params}, TOKENS)
  np.testing.assert_array_equal(np.asarray(default), np.asarray(xla))
  with pytest.raises(UserError, match='attention_impl must be one of auto, xla, cudnn, splash'):
    TransformerLM(**TINY, attention_impl='flash').init(jax.random.key(0), TOKENS)
