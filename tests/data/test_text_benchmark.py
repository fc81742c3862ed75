"""benchmarks/data_pipeline.py: its quick run prints every number it promises (timings are
never asserted)."""

import json

import pytest

from tests.fixture_data import SHAKESPEARE_SLICE
from tests.helpers import run_module


def run_json(*args: str, timeout: float) -> dict:
  """`python -m benchmarks.data_pipeline ARGS`'s one JSON line, after asserting exit 0: forked,
  with its child processes (the rss section's) forked in turn."""
  proc = run_module('benchmarks.data_pipeline', *args, timeout=timeout, fork_children=True)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.strip().splitlines()
  assert len(lines) == 1, proc.stdout
  return json.loads(lines[0])


@pytest.mark.slow
def test_quick_run_prints_every_number():
  out = run_json('--quick', timeout=300)
  assert out['benchmark'] == 'data_pipeline'
  for kind in ('sentencepiece', 'bpe'):  # The store build against each library's own encode.
    build = out['build'][kind]
    for stat in ('median', 'best'):
      rates = build[f'{stat}_tokens_per_sec']
      assert rates['library'] > 0 and rates['store'] > 0
      assert all(rate > 0 for rate in rates.values()) and len(rates) >= 2
      # The overheads compare what the docstring says: the fastest library run in one process
      # against the store ('1'), and the fastest of each side overall ('any').
      one = max(r for n, r in rates.items() if n.startswith('library') and 'processes' not in n)
      overall = (max(r for n, r in rates.items() if n.startswith('library'))
                 / max(r for n, r in rates.items() if n.startswith('store')))
      overhead = build[f'overhead_{stat}']
      assert overhead['1'] == pytest.approx(one / rates['store'] - 1, abs=1e-3)
      assert overhead['any'] == pytest.approx(overall - 1, abs=1e-3)
    assert set(build['overhead_paired']) == set(build['overhead_median'])
    # Tokens of one copy of the data root's Tiny Shakespeare: at least one per 10 bytes.
    assert build['tokens'] > len(SHAKESPEARE_SLICE.read_bytes()) // 10
    assert set(build['cpu_overhead']) >= {'store'}
  for shape in ('stdlib_tiny', 'llama125m'):
    assert out['loader'][shape]['direct_tokens_per_sec'] > 0
    assert out['loader'][shape]['grain_tokens_per_sec'] > 0
  assert set(out['steps']) == {'stdlib_tiny_cpu_tokens_per_sec',
                               'llama125m_cpu_estimate_tokens_per_sec',
                               'llama125m_h200_40pct_mfu_tokens_per_sec'}
  # The suite's slice is ~50 rows of 512 tokens once tokenized, where a last part-filled row
  # alone costs up to 2% (the full text packs to >= 0.99: test_text_data.py's bytes by line).
  assert min(out['packing'].values()) >= 0.98
  assert out['rss']['2']['store_mb'] == 2 and out['rss']['20']['store_mb'] == 20

