"""python -m benchmarks.grpo_step --quick: a GRPO step's parts add up to the step and its
sampling is timed beside the decoder alone, in one JSON object."""

import pytest

from tests.test_benchmarks import run_json

pytestmark = pytest.mark.slow


def test_grpo_step_splits_the_step_into_sampling_and_training():
  out = run_json('benchmarks.grpo_step', '--quick')
  assert out['benchmark'] == 'grpo_step' and out['steps_timed'] == 1
  parts = ('sample', 'host', 'score', 'update')
  assert sum(out[f'{p}_ms'] for p in parts) == pytest.approx(out['step_ms'])
  assert sum(out[f'{p}_share'] for p in parts) == pytest.approx(1.0)
  assert out['sampling_tokens_per_sec'] > 0 and out['decoder_tokens_per_sec'] > 0
