"""What a config.json's RoPE dict becomes (`rope_config.read_rope`) against the published
defaults (tests/layers/rope_reference.py): yarn's and longrope's attention factor when the
file leaves it out, their factor when the file leaves that out (max_position_embeddings /
original_max_position_embeddings), which original length each kind reads, and the
frequencies of the resulting layer at and past that length."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.interop import rope_config
from paxlike.layers import rope
from tests.layers import rope_reference as ref

BASE = dict(max_position_embeddings=256, rope_theta=10_000.0)


@pytest.mark.parametrize('extra, factor, attention', [
    (dict(factor=4.0, original_max_position_embeddings=64), 4.0, ref.yarn_attention_factor(4.0)),
    (dict(original_max_position_embeddings=64), 4.0, ref.yarn_attention_factor(4.0)),
    (dict(factor=8.0, original_max_position_embeddings=64, mscale=0.7, mscale_all_dim=0.9),
     8.0, ref.yarn_attention_factor(8.0, 0.7, 0.9)),
    (dict(factor=4.0, original_max_position_embeddings=64, attention_factor=1.25), 4.0, 1.25),
    (dict(factor=1.0, original_max_position_embeddings=256), 1.0, 1.0),
])
def test_yarn_factor_and_attention_factor(extra, factor, attention):
  _, scaling = rope_config.read_rope({**BASE, 'rope_scaling': {'rope_type': 'yarn', **extra}})
  assert (scaling.factor, scaling.original_max_len) == (factor, 64 if factor != 1 else 256)
  assert scaling.attention_factor == pytest.approx(attention, rel=1e-12)
  got = np.asarray(rope.frequencies(32, 10_000.0, scaling, jnp.arange(8)), np.float64)
  np.testing.assert_allclose(got, ref.yarn(32, 10_000.0, factor, scaling.original_max_len),
                             rtol=3e-6)


def longrope(extra: dict, top: dict) -> rope.RopeScaling:
  factors = dict(short_factor=[1.0 + i / 16 for i in range(16)],
                 long_factor=[2.0 + i / 4 for i in range(16)])
  return rope_config.read_rope({**BASE, **top, 'rope_scaling': {
      'type': 'longrope', **factors, **extra}})[1]


def test_longrope_reads_phi3s_top_level_original_length_and_its_ratio():
  scaling = longrope({}, {'original_max_position_embeddings': 32})
  assert (scaling.factor, scaling.original_max_len) == (8.0, 32)
  assert scaling.attention_factor == pytest.approx(ref.longrope_attention_factor(8.0, 32))
  explicit = longrope({'factor': 2.0}, {'original_max_position_embeddings': 32})
  assert explicit.attention_factor == pytest.approx(ref.longrope_attention_factor(2.0, 32))
  at = lambda n: np.asarray(rope.frequencies(32, 10_000.0, scaling, jnp.arange(n)), np.float64)
  short, long = list(scaling.short_factor), list(scaling.long_factor)
  np.testing.assert_allclose(at(32), ref.longrope(32, 10_000.0, short, long, 32, 32), rtol=3e-6)
  np.testing.assert_allclose(at(33), ref.longrope(32, 10_000.0, short, long, 32, 33), rtol=3e-6)
  assert not np.allclose(at(32), at(33))


def test_dynamic_and_llama3_read_their_original_lengths():
  _, dynamic = rope_config.read_rope({**BASE, 'rope_scaling': {'rope_type': 'dynamic',
                                                               'factor': 2.0}})
  assert dynamic.original_max_len == 256  # max_position_embeddings, as transformers reads it.
  got = np.asarray(rope.frequencies(32, 10_000.0, dynamic, jnp.arange(257)), np.float64)
  np.testing.assert_allclose(got, ref.dynamic(32, 10_000.0, 2.0, 256, 257), rtol=3e-6)
  _, llama3 = rope_config.read_rope({**BASE, 'rope_scaling': {
      'rope_type': 'llama3', 'factor': 8.0, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0,
      'original_max_position_embeddings': 64}})
  assert (llama3.factor, llama3.original_max_len) == (8.0, 64)
  assert math.isclose(llama3.high_freq_factor, 4.0)
