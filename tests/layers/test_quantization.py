"""A quantized frozen base (paxlike/layers/quantization.py) against independent numpy: the NF4
codebook from the normal quantiles it is built from, int8 and NF4 round trips and their error
bounds, double quantization, and a quantized model against its float one."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from paxlike.layers import TransformerLM
from paxlike.layers import quantization as qz


def test_nf4_codebook_is_the_papers_normal_quantiles():
  """QLoRA's NF4: 8 positive and 7 negative quantiles of N(0, 1) (offset 0.9677, halves of
  2^4 + 1 bins as bitsandbytes builds them), an exact zero, normalised by the largest."""
  offset = 0.9677083
  positive = stats.norm.ppf(np.linspace(offset, 0.5, 9)[:-1])
  negative = -stats.norm.ppf(np.linspace(offset, 0.5, 8)[:-1])
  values = np.sort(np.concatenate([positive, [0.0], negative]))
  np.testing.assert_allclose(qz.NF4_CODEBOOK, values / values.max(), atol=1e-7)
  assert qz.NF4_CODEBOOK[7] == 0.0 and len(set(qz.NF4_CODEBOOK.tolist())) == 16


def _weights(shape, seed=0):
  return np.random.default_rng(seed).normal(0, 0.05, shape).astype(np.float32)


@pytest.mark.parametrize('shape,in_axes', [((128, 4, 64), 1), ((4, 64, 96), 2), ((64, 32), 1)])
def test_int8_is_per_output_channel_absmax_within_half_a_step(shape, in_axes):
  w = _weights(shape)
  q = qz.quantize(w, 'int8', in_axes)
  scale = np.abs(w).max(axis=tuple(range(in_axes)), keepdims=True) / 127
  np.testing.assert_allclose(q['scale'], scale, rtol=1e-6)
  np.testing.assert_array_equal(q['int8'], np.round(w / scale).astype(np.int8))
  error = np.abs(np.asarray(qz.dequantize(q)) - w)
  assert np.all(error <= scale / 2 * (1 + 1e-5))


@pytest.mark.parametrize('shape,in_axes', [((128, 4, 64), 1), ((4, 128, 32), 2)])
def test_nf4_is_the_codebooks_nearest_value_times_each_blocks_absmax(shape, in_axes):
  w = _weights(shape, seed=1)
  got = np.asarray(qz.dequantize(qz.quantize(w, 'nf4', in_axes, double=False)))
  axis = in_axes - 1
  blocks = np.moveaxis(w, axis, 0).reshape(shape[axis] // 64, 64, -1)
  absmax = np.abs(blocks).max(axis=1, keepdims=True)
  nearest = qz.NF4_CODEBOOK[np.abs(blocks[..., None] / absmax[..., None]
                                   - qz.NF4_CODEBOOK).argmin(-1)]
  want = np.moveaxis((nearest * absmax).reshape(np.moveaxis(w, axis, 0).shape), 0, axis)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
  # Each weight is within half the codebook's widest gap of its block's scale.
  assert np.all(np.abs(got - w) <= np.diff(qz.NF4_CODEBOOK).max() / 2 * absmax.max() + 1e-7)


def test_nf4_codes_pack_two_a_byte_and_unpack_to_every_value():
  codes = jnp.arange(16, dtype=jnp.uint8).reshape(16, 1).repeat(3, axis=1)
  packed = qz._pack(codes, 0)
  assert packed.shape == (8, 3) and packed.dtype == jnp.uint8
  assert int(packed[0, 0]) == 0 | (1 << 4)
  np.testing.assert_array_equal(qz._unpack(packed, 0), codes)


def test_nf4_values_look_every_code_up_in_the_codebook_exactly_without_a_gather():
  codes = jnp.asarray(np.random.default_rng(0).integers(0, 16, (64, 3)), jnp.uint8)
  got = jax.jit(qz.nf4_values)(codes)
  assert got.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(got), qz.NF4_CODEBOOK[np.asarray(codes)])
  assert 'gather' not in jax.jit(qz.nf4_values).lower(codes).as_text()


def test_double_quantization_keeps_the_absmax_within_half_an_int8_step_of_256():
  w = _weights((512, 8, 64), seed=2)
  single = qz.quantize(w, 'nf4', 1, double=False)
  double = qz.quantize(w, 'nf4', 1, double=True)
  np.testing.assert_array_equal(single['nf4'], double['nf4'])
  recovered = np.asarray(qz._dequantize_absmax(double))
  centered = (np.asarray(single['absmax']) - np.asarray(single['absmax']).mean()).reshape(-1)
  steps = np.abs(np.pad(centered, (0, (-centered.size) % 256)).reshape(-1, 256)).max(1) / 127
  bound = np.repeat(steps, 256)[:centered.size].reshape(recovered.shape) / 2
  assert np.all(np.abs(recovered - np.asarray(single['absmax'])) <= bound * (1 + 1e-4) + 1e-9)
  # 8 bits per absmax plus 32 per 256 of them, instead of 32 per absmax.
  bits = lambda q: sum(np.asarray(v).nbytes for k, v in q.items() if k != 'nf4') * 8
  assert bits(double) / single["absmax"].size == pytest.approx(8 + 32 / 256, rel=0.01)


TOKENS = jax.random.randint(jax.random.key(0), (2, 16), 0, 64, dtype=jnp.int32)
FLOAT = TransformerLM(vocab_size=64, num_layers=2, d_model=256, num_heads=4, d_ff=128,
                      lora_rank=2, lora_targets=('query', 'wo'))


# The quantized model's logits against the float model's: RMS of the difference over the RMS
# of the logits (measured: int8 0.011, NF4 0.16, on these random weights; bounds with margin).
BOUNDS = {'int8': 0.03, 'nf4': 0.3}


@pytest.mark.parametrize('scan', [False, True])
@pytest.mark.parametrize('kind', ['int8', 'nf4'])
def test_a_quantized_model_is_its_float_model_within_the_stated_bound(kind, scan):
  model = FLOAT.clone(scan_layers=scan)
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), TOKENS))['params']
  quantized = model.clone(base_quantization=kind)
  qparams = qz.quantize_tree(params, kind)
  declared = jax.eval_shape(quantized.init, jax.random.key(0), TOKENS)['params']
  assert (jax.tree.map(jnp.shape, qparams)
          == jax.tree.map(lambda x: x.shape, nn.unbox(declared)))
  want = jax.jit(model.apply)({'params': params}, TOKENS)
  got = jax.jit(quantized.apply)({'params': qparams}, TOKENS)
  rms = lambda x: float(jnp.sqrt(jnp.mean(jnp.square(x))))
  assert 0 < rms(got - want) / rms(want) < BOUNDS[kind]
  # Dequantized back into the float model, the same function as the quantized one.
  np.testing.assert_allclose(jax.jit(model.apply)({'params': qz.dequantize_tree(qparams)},
                                                  TOKENS), got, rtol=1e-5, atol=1e-5)


def test_kernels_that_cannot_be_stored_are_refused_in_one_line():
  with pytest.raises(ValueError, match='multiples of 64'):
    TransformerLM(vocab_size=64, num_layers=1, d_model=64, num_heads=4, d_ff=128,
                  base_quantization='nf4').init(jax.random.key(0), TOKENS)
  with pytest.raises(ValueError, match='base_quantization must be one of'):
    TransformerLM(vocab_size=64, base_quantization='fp4').init(jax.random.key(0), TOKENS)
  with pytest.raises(ValueError, match='dense layers only'):
    TransformerLM(vocab_size=64, d_model=128, num_heads=2, d_ff=128, num_experts=4,
                  base_quantization='int8').init(jax.random.key(0), TOKENS)


def test_quantizing_a_kernel_nf4_cannot_block_is_one_line_not_a_reshape_error():
  # The out projection [heads, 32, embed]: its last input axis is not a multiple of 64.
  with pytest.raises(ValueError, match=r'nf4 needs input axes that are multiples of 64 .*\(4, 32, 128\)'):
    qz.quantize(_weights((4, 32, 128)), 'nf4', in_axes=2)
  with pytest.raises(ValueError, match='nf4 needs input axes'):
    qz.quantize_tree({'layers': {'attention': {'out': _weights((2, 4, 32, 128))}}}, 'nf4')
