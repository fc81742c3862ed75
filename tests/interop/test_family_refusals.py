"""Config values no family honours are refused with one line naming the field and its value;
unknown model types name the supported ones; nothing is ignored silently."""

import pytest

from paxlike import interop
from paxlike.errors import UserError
from tests.interop import checkpoints

LLAMA = checkpoints.CASES['llama2']


@pytest.mark.parametrize('config, message', [
    ({'model_type': 'gpt2', 'n_embd': 32}, r"model_type='gpt2' is not supported \(supported: "
                                           r'gemma2, gemma3_text, llama, .*qwen3'),
    ({'hidden_size': 32}, r'model_type=None is not supported'),
    ({k: v for k, v in LLAMA.items() if k != 'hidden_size'}, 'lacks hidden_size'),
    ({**LLAMA, 'mlp_bias': True}, 'mlp_bias=True'),
    ({**LLAMA, 'attention_dropout': 0.1}, 'attention_dropout=0.1'),
    ({**LLAMA, 'hidden_act': 'relu'}, "hidden_act='relu'"),
    ({**LLAMA, 'some_new_switch': 3}, "some_new_switch=3 is not supported for model_type 'llama'"),
    ({**LLAMA, 'rope_scaling': {'type': 'su', 'factor': 2.0}}, "rope_type='su'"),
    ({**LLAMA, 'rope_scaling': {'rope_type': 'linear', 'factor': 2.0, 'mrope_section': [1]}},
     'mrope_section'),
    ({**LLAMA, 'partial_rotary_factor': 0.5}, 'partial_rotary_factor=0.5'),
    ({**LLAMA, 'rope_parameters': {'rope_type': 'default', 'rope_theta': 500.0}},
     'rope_theta=10000.0 and rope_parameters.rope_theta=500.0'),
    ({**checkpoints.CASES['qwen2'], 'use_sliding_window': True}, 'use_sliding_window=True'),
    ({**checkpoints.CASES['qwen2'], 'head_dim': 16}, 'head_dim=16'),
    ({**checkpoints.CASES['phi3'], 'resid_pdrop': 0.1}, 'resid_pdrop=0.1'),
    ({**checkpoints.CASES['gemma2'], 'layer_types': ['full_attention'] * 4}, 'layer_types='),
    ({**checkpoints.CASES['gemma3_text'], 'use_bidirectional_attention': True},
     'use_bidirectional_attention=True'),
    ({**checkpoints.v5(checkpoints.CASES['gemma3_text']), 'rope_parameters': {
        'full_attention': {'rope_type': 'default', 'rope_theta': 1e6},
        'sliding_attention': {'rope_type': 'linear', 'factor': 2.0, 'rope_theta': 1e4}}},
     'sliding_attention.*linear'),
])
def test_unsupported_config_values_are_refused_by_name(config, message):
  with pytest.raises(UserError, match=message):
    interop.config_from_hf(config)


def test_a_config_in_either_layout_gives_the_same_model():
  for case, cfg in checkpoints.CASES.items():
    assert interop.config_from_hf(cfg) == interop.config_from_hf(checkpoints.v5(cfg)), case
