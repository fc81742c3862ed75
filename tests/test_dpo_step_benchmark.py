"""benchmarks/dpo_step.py at tiny sizes: one JSON object whose DPO and SFT sides score the same
tokens (the chosen-rows baseline fewer), whose DPO sides start at log 2 (the reference, adapters
off or the frozen copy, is the policy at step 0), and whose ratios are read from the repeats.
Timings are never asserted (the machine may be loaded)."""

import numpy as np
import pytest

from tests.test_benchmarks import run_json


@pytest.mark.slow
def test_dpo_step_benchmark_compares_the_same_tokens():
  out = run_json('benchmarks.dpo_step', '--quick')
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


def test_the_trl_peer_script_starts_without_any_peer_and_pairs_its_repeats():
  import importlib.util  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel
  from tests.helpers import REPO  # pylint: disable=import-outside-toplevel
  proc = subprocess.run([sys.executable, '-X', 'importtime', 'benchmarks/peers/trl_dpo.py',
                         '--help'], cwd=REPO, capture_output=True, text=True, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert '--peer_python' in proc.stdout and '--paxlike_json' in proc.stdout
  imported = {line.split('|')[-1].strip() for line in proc.stderr.splitlines() if '|' in line}
  assert not {'torch', 'transformers', 'peft', 'trl', 'jax'} & imported
  spec = importlib.util.spec_from_file_location('trl_dpo', REPO / 'benchmarks/peers/trl_dpo.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  # Ratios of repeats measured back to back, then their median: 2/1, 4/1, 9/3 -> 3.
  assert module.ratio({'a': [2.0, 4.0, 9.0], 'b': [1.0, 1.0, 3.0]}, 'a', 'b') == 3.0
  assert module.ratio({'a': [2.0, 6.0], 'b': [1.0, 2.0]}, 'a', 'b') == 2.5
