"""The Pallas splash kernel on a TPU against XLA's attention (computed in float32 at the highest
matmul precision from the same bf16 inputs): forward and gradients of q, k and v, within bf16
tolerance, for causal GQA, MHA, a sliding window, packed segments and soft-capped scores.
(tests/layers/test_attention_kernels.py checks the same kernel in Pallas' interpreter on CPU.)"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.layers import attention_kernels

pytestmark = pytest.mark.tpu

B, T = 2, 1024
CASES = {  # name: (query heads, kv heads, head dim, window, segmented, softcap)
    'causal_gqa': (8, 2, 64, None, False, None),
    'causal_mha_h128': (4, 4, 128, None, False, None),
    'sliding_window': (8, 2, 64, 256, False, None),
    'segments': (8, 2, 64, None, True, None),
    'softcap': (8, 2, 64, None, False, 30.0),
    'all_of_them': (8, 4, 64, 300, True, 50.0),
}


def _inputs(n, k, h, segmented):
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (B, T, n, h), jnp.bfloat16)
  kv = [jax.random.normal(key, (B, T, k, h), jnp.bfloat16) for key in keys[1:]]
  ids = None
  if segmented:  # Three documents in row 0 (uneven), two in row 1, padding (0) at the end.
    ids = np.zeros((B, T), np.int32)
    ids[0, :300], ids[0, 300:700], ids[0, 700:1000] = 1, 2, 3
    ids[1, :512], ids[1, 512:900] = 1, 2
    ids = jnp.asarray(ids)
  return q, *kv, ids


def _reference(q, k, v, window, ids, softcap):
  q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
  with jax.default_matmul_precision('highest'):
    if softcap is None:
      return attention_kernels.attend(q, k, v, 'xla', window, segment_ids=ids)
    return attention_kernels.softcapped_attention(q, k, v, window, ids, None, softcap)


def _splash(q, k, v, window, ids, softcap):
  return attention_kernels.splash_attention(q, k, v, window, segment_ids=ids, softcap=softcap)


def _grads(attn, q, k, v):
  """dq, dk, dv of a loss weighing every output feature differently."""
  weights = jnp.cos(jnp.arange(q.shape[-1], dtype=jnp.float32))
  loss = lambda q, k, v: (attn(q, k, v).astype(jnp.float32) * weights).sum()
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)


def _close(got, want, what, rel=2e-2):
  """A relative-norm check (bf16 carries ~3 significant digits), and no element far off."""
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  error = np.linalg.norm(got - want) / np.linalg.norm(want)
  assert error < rel, f'{what}: relative error {error:.4f}'
  scale = np.abs(want).max()
  assert np.abs(got - want).max() < 10 * rel * scale, f'{what}: an element is far off'


@pytest.mark.parametrize('case', list(CASES))
def test_splash_on_tpu_matches_xla_forward_and_gradients(case):
  n, k, h, window, segmented, softcap = CASES[case]
  q, k_, v, ids = _inputs(n, k, h, segmented)
  splash = functools.partial(_splash, window=window, ids=ids, softcap=softcap)
  reference = functools.partial(_reference, window=window, ids=ids, softcap=softcap)
  _close(jax.jit(splash)(q, k_, v), jax.jit(reference)(q, k_, v), f'{case} forward')
  for name, got, want in zip('qkv', _grads(splash, q, k_, v), _grads(reference, q, k_, v)):
    _close(got, want, f'{case} d{name}')


def test_the_model_picks_splash_on_tpu():
  assert attention_kernels.resolve('auto', dtype=jnp.bfloat16, num_heads=8, num_kv_heads=2,
                                   head_dim=64, seq_len=T) == 'splash'
