"""The exported config.json says its RoPE in both layouts (transformers 4 reads rope_scaling,
5 reads rope_parameters), and a config whose two layouts disagree is refused."""

import pytest

from paxlike.errors import UserError
from paxlike.interop import rope_config
from paxlike.layers.rope import RopeScaling
from tests.interop import checkpoints


def test_a_scaled_rope_is_written_in_both_layouts_and_reads_back():
  scaling = RopeScaling('llama3', 8.0, 64, low_freq_factor=1.0, high_freq_factor=4.0)
  written = rope_config.rope_config(500_000.0, scaling)
  assert written['rope_scaling'] == {k: v for k, v in written['rope_parameters'].items()
                                     if k != 'rope_theta'}
  assert written['rope_scaling']['rope_type'] == 'llama3'
  hf = dict(checkpoints.BASE, **written)
  assert rope_config.read_rope(hf) == (500_000.0, scaling)
  assert rope_config.rope_config(10_000.0, None)['rope_scaling'] is None


def test_layouts_that_disagree_are_refused():
  hf = checkpoints.v5(dict(checkpoints.CASES['llama3.1']))
  hf['rope_scaling'] = {'rope_type': 'linear', 'factor': 8.0}
  with pytest.raises(UserError, match="rope_scaling=.*'linear'.* and rope_parameters of rope_type "
                                      "'llama3', factor 8.0: they disagree"):
    rope_config.read_rope(hf)
