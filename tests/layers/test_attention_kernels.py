"""Attention kernels: 'auto' resolution per platform, the Pallas splash kernel (run in Pallas'
interpreter on CPU) against XLA's attention, and forced kernels the platform lacks as exit 2."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.errors import UserError
from paxlike.layers import attention_kernels
from tests.helpers import TINY, run_cli, run_script

B, T, N, K, H = 2, 256, 4, 2, 16


def _qkv(dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(0), 3)
  return (jax.random.normal(keys[0], (B, T, N, H), dtype),
          jax.random.normal(keys[1], (B, T, K, H), dtype),
          jax.random.normal(keys[2], (B, T, K, H), dtype))


@functools.partial(jax.jit, static_argnums=3)
def _xla(q, k, v, window):
  return attention_kernels.attend(q, k, v, 'xla', window)


def _splash(q, k, v, window):
  return attention_kernels.splash_attention(q, k, v, window, interpret=True)


def _loss_grads(attn, q, k, v):
  """Gradients of a loss that weighs every output feature differently (so no symmetry hides
  a wrong dq, dk or dv)."""
  weights = jnp.cos(jnp.arange(H, dtype=jnp.float32))
  return jax.jit(jax.grad(lambda q, k, v: (attn(q, k, v) * weights).sum(), argnums=(0, 1, 2)))(
      q, k, v)


@pytest.mark.parametrize('window', [None, 100])
def test_splash_kernel_in_interpret_mode_equals_xla_forward_and_gradients(window):
  q, k, v = _qkv()
  np.testing.assert_allclose(_splash(q, k, v, window), _xla(q, k, v, window), rtol=1e-5,
                             atol=1e-5)
  for got, want in zip(_loss_grads(functools.partial(_splash, window=window), q, k, v),
                       _loss_grads(functools.partial(_xla, window=window), q, k, v)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_kernel_first_made_inside_a_trace_serves_the_next_trace():
  """The train step's trace makes (and caches) the kernel; the eval step's trace, same shapes,
  reuses it: its masks must be arrays, not the first trace's tracers."""
  q, k, v = (x[:1, :128] for x in _qkv())
  train = jax.jit(lambda q, k, v: _splash(q, k, v, None))(q, k, v)
  evaluate = jax.jit(lambda q, k, v: 2 * _splash(q, k, v, None))(q, k, v)
  np.testing.assert_allclose(evaluate, 2 * train, rtol=1e-6)


class _ScannedSplash(nn.Module):
  """Two scanned layers of splash attention with a learned scale, as lm.Llama125M stacks its
  blocks (nn.scan, params broadcast per layer, no remat)."""

  @nn.compact
  def __call__(self, x, _):
    scale = self.param('scale', nn.initializers.ones, (x.shape[-1],))
    return x + _splash(x * scale, x, x, None), None


def test_a_kernel_first_made_under_flax_scan_init_leaks_no_tracer():
  """lm.Llama125M failed at its first trace on JAX 0.10 ("unexpected tracer ... int8[1,4,4]"):
  flax's scan traces the body's init abstractly, the kernel cached there held a tracer, and
  the next trace used it."""
  layers = nn.scan(_ScannedSplash, variable_axes={'params': 0}, split_rngs={'params': True},
                   length=2)
  x = _qkv()[0][:1, :128, :2]
  params = jax.eval_shape(layers().init, jax.random.key(0), x, None)
  assert params['params']['scale'].shape == (2, H)
  loss = lambda p, x: layers().apply(p, x, None)[0].sum()
  p = layers().init(jax.random.key(0), x, None)
  value, grads = jax.jit(jax.value_and_grad(loss))(p, x)
  assert np.isfinite(float(value)) and grads['params']['scale'].shape == (2, H)


def test_splash_kernel_sees_the_causal_mask():
  q, k, v = _qkv()
  # Changing the last key and value must not change any earlier query's output.
  out = _splash(q, k, v, None)
  changed = _splash(q, k.at[:, -1].add(3.0), v.at[:, -1].add(3.0), None)
  np.testing.assert_array_equal(out[:, :-1], changed[:, :-1])
  assert not np.allclose(out[:, -1], changed[:, -1])


SHARDED = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import PartitionSpec as P
from paxlike.layers import attention_kernels
from tests.layers.test_attention_kernels import _qkv
q, k, v = _qkv()
mesh = jax.make_mesh((2, 2), ('data', 'model'), axis_types=(jax.sharding.AxisType.Auto,) * 2)
# Query heads split over 'model', kv heads replicated: the kernel repeats them per shard.
q_spec, kv_spec = P('data', None, 'model', None), P('data', None, None, None)
with jax.set_mesh(mesh):
  got = jax.jit(lambda q, k, v: attention_kernels.attend(
      q, k, v, 'splash', None, q_spec, kv_spec, interpret=True))(q, k, v)
want = jax.jit(lambda q, k, v: attention_kernels.attend(q, k, v, 'xla', None))(q, k, v)
print(float(jnp.abs(got - want).max()))
"""


@pytest.mark.slow
def test_splash_kernel_sharded_over_a_mesh_equals_xla():
  assert float(run_script(SHARDED, devices=4).strip()) < 1e-5


def test_auto_resolves_to_xla_on_cpu_and_forced_kernels_the_platform_lacks_are_user_errors():
  shape = dict(dtype=jnp.bfloat16, num_heads=N, num_kv_heads=K, head_dim=128, seq_len=2048)
  assert jax.devices()[0].platform == 'cpu'
  assert attention_kernels.resolve('auto', **shape) == 'xla'
  assert attention_kernels.resolve('xla', **shape) == 'xla'
  with pytest.raises(UserError, match='cuDNN flash attention cannot run here: no NVIDIA GPU'):
    attention_kernels.resolve('cudnn', **shape)
  with pytest.raises(UserError, match="attention_impl='splash' needs a TPU"):
    attention_kernels.resolve('splash', **shape)
  with pytest.raises(UserError, match='attention_impl must be one of'):
    attention_kernels.resolve('flash', **shape)


def test_splash_block_needs_a_128_multiple():
  assert attention_kernels.splash_block(2048) == 1024
  assert attention_kernels.splash_block(1536) == 512
  assert attention_kernels.splash_block(384) == 128
  assert attention_kernels.splash_block(200) is None


def error_lines(stderr: str) -> list[str]:
  """stderr's lines less the note a run that prepares its data prints first (the first run on
  a fresh data root: CI's machine), which says where the data went, not what failed."""
  return [line for line in stderr.strip().splitlines()
          if not line.startswith('prepared stdlib from local files into ')]


@pytest.mark.slow
@pytest.mark.parametrize('mode', ['print_config', 'train', 'eval', 'decode'])
def test_cli_forced_cudnn_on_cpu_is_one_line_exit_2_in_every_mode(tmp_path, mode):
  proc = run_cli(*TINY, f'--mode={mode}', f'--job_log_dir={tmp_path}',
                 '--fdl_set=model.attention_impl=cudnn', check=False)
  lines = error_lines(proc.stderr)
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
  assert lines[0].startswith("paxlike: error: attention_impl='cudnn': cuDNN flash attention")
  assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize('mode', ['print_config', 'train'])
@pytest.mark.parametrize('override, message', [
    ('model.dtype=float16', 'invalid model config: dtype float16 cannot run on CPU'),
    ('model.num_heads=3', 'invalid model config: d_model=128 is not a multiple of num_heads=3')])
def test_cli_configs_the_platform_or_layers_reject_are_one_line_exit_2(tmp_path, mode, override,
                                                                       message):
  proc = run_cli(*TINY, f'--mode={mode}', f'--job_log_dir={tmp_path}', f'--fdl_set={override}',
                 check=False)
  lines = error_lines(proc.stderr)
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
  assert lines[0].startswith(f'paxlike: error: {message}')
  assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_cli_logs_the_resolved_kernel_and_writes_it_to_config_txt(tmp_path):
  proc = run_cli(*TINY, f'--job_log_dir={tmp_path}', '--fdl_set=train.num_steps=2')
  assert 'attention kernel: xla' in proc.stderr
  assert (tmp_path / 'config.txt').read_text().endswith('# attention kernel: xla\n')
