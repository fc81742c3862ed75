"""Each RoPE scaling kind of paxlike.layers.rope against frequencies computed in float64 from
the published definitions (tests/layers/rope_reference.py): inside its smoothing band, at each
of the band's ends, and for the length-dependent kinds at seq_len == original_max_len (the
short side, as transformers puts it: its update compares max(position_ids) + 1 > original)
and one past it."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.layers import rope
from paxlike.layers.rope import RopeScaling
from tests.layers import rope_reference as ref

DIM, BASE = 32, 10_000.0


def frequencies(scaling: RopeScaling | None, seq_len: int, dim: int = DIM,
                base: float = BASE) -> np.ndarray:
  """paxlike's inv_freq for a call at positions 0..seq_len-1."""
  return np.asarray(rope.frequencies(dim, base, scaling, jnp.arange(seq_len)), np.float64)


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
  """Equal up to float32 rounding of base^(-2i/d) (paxlike computes in float32)."""
  np.testing.assert_allclose(got, want, rtol=3e-6, atol=0)


def test_plain_and_linear():
  assert_close(frequencies(None, 8), ref.default(DIM, BASE))
  assert_close(frequencies(RopeScaling('linear', 4.0), 8), ref.linear(DIM, BASE, 4.0))


@pytest.mark.parametrize('seq_len', [1, 15, 16, 17, 40])
def test_dynamic_is_plain_up_to_and_at_the_original_length_and_grows_past_it(seq_len):
  scaling = RopeScaling('dynamic', 2.0, original_max_len=16)
  want = ref.dynamic(DIM, BASE, 2.0, 16, seq_len)
  assert_close(frequencies(scaling, seq_len), want)
  plain = np.allclose(want, ref.default(DIM, BASE), rtol=1e-9)
  assert plain == (seq_len <= 16)  # The reference tells the sides apart.


def test_dynamic_and_longrope_read_the_longest_position_of_the_batch():
  """A batch of a long and a short (restarted) row: the longest position over the batch."""
  positions = jnp.asarray([np.arange(20), np.minimum(np.arange(20), 4)])
  dynamic = RopeScaling('dynamic', 2.0, original_max_len=16)
  got = np.asarray(rope.frequencies(DIM, BASE, dynamic, positions), np.float64)
  assert_close(got, ref.dynamic(DIM, BASE, 2.0, 16, 20))
  short = positions.at[0].set(np.minimum(np.arange(20), 15))  # Longest position 15: S = 16.
  assert_close(np.asarray(rope.frequencies(DIM, BASE, dynamic, short), np.float64),
               ref.default(DIM, BASE))


def llama3_bands(dim: int, base: float, original: float, low: float, high: float) -> set[str]:
  """Which of llama3's three regimes the wavelengths of `dim` fall in."""
  kinds = set()
  for t in ref.default(dim, base):
    wavelen = 2 * math.pi / t
    kinds.add('scaled' if wavelen > original / low else 'kept' if wavelen < original / high
              else 'smoothed')
  return kinds


def test_llama3_inside_its_band():
  scaling = RopeScaling('llama3', 8.0, 1024, low_freq_factor=1.0, high_freq_factor=8.0)
  assert llama3_bands(DIM, 500_000.0, 1024, 1.0, 8.0) == {'scaled', 'kept', 'smoothed'}
  assert_close(frequencies(scaling, 8, base=500_000.0),
               ref.llama3(DIM, 500_000.0, 8.0, 1.0, 8.0, 1024))


@pytest.mark.parametrize('index, side', [(4, 'low'), (6, 'low'), (2, 'high'), (5, 'high')])
def test_llama3_at_each_end_of_its_band(index, side):
  """A wavelength exactly at original / low_freq_factor or original / high_freq_factor (the
  factor chosen so), where the smoothed value meets the scaled or the kept one."""
  wavelen = 2 * math.pi / ref.default(DIM, 500_000.0)[index]
  original = 1024
  low, high = (original / wavelen, original / wavelen * 4) if side == 'low' else (
      original / wavelen / 4, original / wavelen)
  scaling = RopeScaling('llama3', 8.0, original, low_freq_factor=low, high_freq_factor=high)
  want = ref.llama3(DIM, 500_000.0, 8.0, low, high, original)
  assert_close(frequencies(scaling, 8, base=500_000.0), want)
  theta = ref.default(DIM, 500_000.0)[index]
  assert want[index] == pytest.approx(theta / 8.0 if side == 'low' else theta, rel=1e-12)


YARN_CASES = {  # name: (original, beta_fast, beta_slow, truncate)
    'ramp over features 0..5': (64, 32.0, 1.0, True),
    'untruncated ends': (64, 32.0, 1.0, False),
    'fast end above 0': (4096, 32.0, 1.0, True),
    'slow end clipped to dim - 1': (10**9, 32.0, 1.0, True),
    'ends equal (nudged by 0.001)': (64, 2.0, 2.0, False),
}


@pytest.mark.parametrize('case', sorted(YARN_CASES))
def test_yarn_inside_and_at_the_ends_of_its_ramp(case):
  original, fast, slow, truncate = YARN_CASES[case]
  scaling = RopeScaling('yarn', 4.0, original, beta_fast=fast, beta_slow=slow, truncate=truncate)
  want = ref.yarn(DIM, BASE, 4.0, original, fast, slow, truncate)
  assert_close(frequencies(scaling, 8), want)
  lo, hi = ref.yarn_bounds(DIM, BASE, original, fast, slow, truncate)
  theta = ref.default(DIM, BASE)
  if case == 'ramp over features 0..5':
    assert (lo, hi) == (0, 5)
    inside = (want > theta / 4 * (1 + 1e-9)) & (want < theta * (1 - 1e-9))
    assert inside.sum() == 4  # Features 1..4 are blends.
  if case == 'fast end above 0':
    assert lo > 0 and want[0] == theta[0]
  if case == 'slow end clipped to dim - 1':
    assert hi == DIM - 1


def test_yarn_and_longrope_scale_cos_and_sin_by_their_attention_factor():
  positions = jnp.arange(20)
  for scaling, inv in (
      (RopeScaling('yarn', 4.0, 64, attention_factor=ref.yarn_attention_factor(4.0)),
       ref.yarn(DIM, BASE, 4.0, 64)),
      (RopeScaling('longrope', 4.0, 16, attention_factor=ref.longrope_attention_factor(4.0, 16),
                   short_factor=(1.5,) * 16, long_factor=(3.0,) * 16),
       ref.longrope(DIM, BASE, [1.5] * 16, [3.0] * 16, 16, 20))):
    cos, sin = rope.tables(positions, DIM, BASE, scaling)
    angles = np.arange(20)[:, None] * inv
    np.testing.assert_allclose(np.asarray(cos)[:, 0], np.cos(angles) * scaling.attention_factor,
                               rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(sin)[:, 0], np.sin(angles) * scaling.attention_factor,
                               rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize('seq_len', [1, 16, 17, 30])
def test_longrope_takes_the_short_factors_up_to_and_at_the_original_length(seq_len):
  rng = np.random.default_rng(0)
  short, long = rng.uniform(1, 2, 16).tolist(), rng.uniform(2, 8, 16).tolist()
  scaling = RopeScaling('longrope', 4.0, 16, short_factor=tuple(short), long_factor=tuple(long))
  assert_close(frequencies(scaling, seq_len),
               ref.longrope(DIM, BASE, short, long, 16, seq_len))
  assert np.allclose(frequencies(scaling, seq_len), ref.default(DIM, BASE) / short,
                     rtol=1e-5) == (seq_len <= 16)
