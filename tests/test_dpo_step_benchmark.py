"""benchmarks/dpo_step.py at tiny sizes: one JSON object whose DPO and SFT sides score the same
tokens (the chosen-rows baseline fewer), whose DPO sides start at log 2 (the reference, adapters
off or the frozen copy, is the policy at step 0), and whose ratios are read from the repeats.
Timings are never asserted (the machine may be loaded)."""

import numpy as np
import pytest

from tests.test_benchmarks import run_json


@pytest.mark.slow
def test_dpo_step_benchmark_compares_the_same_tokens():
  out = run_json('benchmarks/dpo_step.py', '--quick')
  assert out['benchmark'] == 'dpo_step' and out['goal'] == 2.2
  sides = ('sft_lora', 'dpo_lora', 'sft_lora_chosen', 'sft_full', 'dpo_full', 'sft_full_chosen')
  assert all(out[s]['ms_per_step'] > 0 for s in sides)
  assert out['dpo_lora']['targets'] == out['sft_lora']['targets'] == out['sft_full']['targets']
  assert 0 < out['sft_lora_chosen']['targets'] < out['sft_lora']['targets']
  for side in ('dpo_lora', 'dpo_full'):
    assert out[side]['first_loss'] == pytest.approx(np.log(2), abs=1e-6)
  assert set(out['ratios']) == {'lora_same_tokens', 'lora_chosen_rows', 'full_same_tokens',
                                'full_chosen_rows'}
  assert all(r > 0 for r in out['ratios'].values())
  assert out['meets_goal'] == (out['ratios']['lora_same_tokens'] <= 2.2)
