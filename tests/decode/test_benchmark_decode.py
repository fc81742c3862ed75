"""python -m benchmarks.decode --quick: one JSON object with both decoders' tokens/s and time to
first token per model and batch, and the same greedy tokens from both."""

import json

from tests.helpers import run_module


def test_decode_benchmark_quick_times_both_decoders_and_they_agree():
  proc = run_module('benchmarks.decode', '--quick')
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout)
  assert out['benchmark'] == 'decode' and out['quick']
  for name in ('stdlib_tiny', 'llama_4x256'):
    for batch in ('batch_1', 'batch_2'):
      row = out[name][batch]
      assert row['same_tokens'], (name, batch)
      for side in ('kv_cache', 'reference'):
        assert row[side]['tokens_per_sec'] > 0 and row[side]['ttft_ms'] > 0
    assert out[name]['batch_2_over_batch_1'] > 0


def test_decode_benchmark_times_a_family_beside_the_llama():
  proc = run_module('benchmarks.decode', '--quick', '--family', 'gemma3_text')
  assert proc.returncode == 0, proc.stderr[-3000:]
  row = json.loads(proc.stdout)['families']['gemma3_text']
  assert row['tokens_per_sec'] > 0 and row['llama_tokens_per_sec'] > 0
  assert abs(row['ratio'] - row['tokens_per_sec'] / row['llama_tokens_per_sec']) < 0.01
  # Gemma 3 at this size: 2 local layers (a ring of the 64-slot window) and 2 global ones of
  # the whole 128-slot cache, against 4 of 128 slots before; keys and values of 2 kv heads of
  # 256 features (float32), plus 4 bytes of segment id per slot and an index per layer.
  per_slot = 2 * 2 * 256 * 4 + 4
  assert row['cache_slots'] == 128
  assert row['full_cache_bytes'] == 4 * (128 * per_slot + 4)
  assert row['cache_bytes'] == 2 * (64 * per_slot + 4) + 2 * (128 * per_slot + 4)
