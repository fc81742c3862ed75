"""Every dense family decodes greedily with the KV cache exactly as full recompute does, past
its sliding windows, local/global layers and soft-caps (a mixed local/global stack also
scanned, its layers' kinds as scanned flags)."""

import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike import interop
from paxlike.decode import generate
from tests.interop import checkpoints

# Dynamic NTK and LongRoPE change every frequency once the sequence passes their threshold, so
# keys cached before it were turned differently than a recompute turns them (transformers'
# cache does the same): they are compared below their threshold (16).
SHORT = {'llama_dynamic', 'phi3'}
CASES = ['llama3.1', 'llama_dynamic', 'mistral_window', 'qwen2', 'qwen3', 'phi3', 'gemma2',
         'gemma3_text']


def recompute(model, params, prompt: np.ndarray, new: int) -> np.ndarray:
  """Greedy tokens by rerunning the model on the whole sequence for each (right-padded to one
  length: causal attention never sees the padding, and one program serves every step)."""
  apply = jax.jit(lambda p, x: model.apply({'params': p}, x))
  seq = np.zeros((1, len(prompt) + new), np.int32)  # Dynamic RoPE reads the longest position.
  seq[0, :len(prompt)] = prompt
  for i in range(len(prompt), len(prompt) + new):
    seq[0, i] = int(jnp.argmax(apply(params, seq)[0, i - 1]))
  return seq[0, len(prompt):len(prompt) + new]


@pytest.mark.parametrize('case', CASES)
def test_cached_decode_equals_recompute(tmp_path, case):
  cfg = checkpoints.CASES[case]
  directory = checkpoints.write(tmp_path, checkpoints.random_tensors(cfg), cfg)
  prompt = checkpoints.tokens(cfg, 1, 6)[0]
  new = 8 if case in SHORT else 16
  for scan in (False, True) if case == 'gemma3_text' else (False,):
    model_cfg, params = interop.load_hf_checkpoint(directory, scan_layers=scan)
    model = fdl.build(model_cfg)
    want = recompute(model, params, prompt, new)
    got = generate(model, params, [prompt, prompt[2:]], max_new_tokens=new, cache_len=32)
    np.testing.assert_array_equal(got[0], want, err_msg=f'{case} scan={scan}')
    np.testing.assert_array_equal(got[1], recompute(model, params, prompt[2:], new))
