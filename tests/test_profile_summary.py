"""benchmarks/profile_summary.py on a trace laid out as JAX 0.10.2 writes a TPU's (device process,
"XLA Ops" thread, hlo_category and long_name in args), and on a real CPU trace."""

import gzip
import json

import pytest

from benchmarks import profile_summary


def _tpu_trace(path):
  meta = [{'ph': 'M', 'pid': 3, 'name': 'process_name', 'args': {'name': '/device:TPU:0'}},
          {'ph': 'M', 'pid': 3, 'tid': 2, 'name': 'thread_name', 'args': {'name': 'XLA Modules'}},
          {'ph': 'M', 'pid': 3, 'tid': 3, 'name': 'thread_name', 'args': {'name': 'XLA Ops'}},
          {'ph': 'M', 'pid': 9, 'name': 'process_name', 'args': {'name': '/host:CPU'}}]
  op = lambda name, ts, dur, cat, **args: {
      'ph': 'X', 'pid': 3, 'tid': 3, 'ts': 100 * ts, 'dur': 100 * dur, 'name': name,  # 100 µs.
      'args': {'hlo_category': cat, 'long_name': f'%{name} = bf16[8,128]{{1,0:T(8,128)}} op()',
               **args}}
  events = [
      {'ph': 'X', 'pid': 3, 'tid': 2, 'ts': 0, 'dur': 1e4, 'name': 'jit_step(1)'},  # Module.
      {'ph': 'X', 'pid': 9, 'tid': 1, 'ts': 0, 'dur': 1e4, 'name': 'fusion.1'},  # Host: not ops.
      op('copy.1', 0, 5, 'data formatting'),
      op('while.2', 5, 85, 'while'),  # Spans the loop body's ops below: self time 85 - 60.
      *[op('fusion.3', 5 + 35 * i, 20, 'convolution fusion', model_flops='200000000000')
        for i in range(2)],
      *[op('splash_mha_fwd.4', 25 + 35 * i, 10, 'custom-call') for i in range(2)],
      op('custom-call.5', 90, 1, 'custom-call'),
      op('all-reduce.6', 91, 4, 'all-reduce'),
      op('add_fusion.7', 95, 5, 'loop fusion'),
  ]
  with gzip.open(path, 'wt') as f:
    json.dump({'displayTimeUnit': 'ns', 'traceEvents': meta + events}, f)


def test_summary_reads_device_ops_with_self_times_and_categories(tmp_path):
  _tpu_trace(tmp_path / 'x.trace.json.gz')
  out = profile_summary.summarize(tmp_path, steps=2, top=3, wall_s=0.02)
  assert out['source'] == 'device'
  # 5 + 25 (while's own) + 40 + 20 + 1 + 4 + 5 units of 100 µs over 2 steps.
  assert out['ops_ms_per_step'] == pytest.approx(100 * 0.1 / 2)
  cats = {c: row['ms_per_step'] * 10 for c, row in out['by_category'].items()}
  assert cats == pytest.approx({'matmul': 20, 'attention': 10, 'other_custom_call': 0.5,
                                'fusion': 2.5, 'copy': 2.5, 'collective': 2, 'host': 0,
                                'control': 12.5})
  assert sum(row['share'] for row in out['by_category'].values()) == pytest.approx(1, abs=1e-3)
  top = out['top_ops']
  assert [r['name'] for r in top] == ['fusion.3', 'while.2', 'splash_mha_fwd.4']
  assert top[0]['count_per_step'] == 1 and top[0]['tflops_per_sec'] == pytest.approx(100)
  assert top[0]['hlo'] == '%fusion.3 = bf16[8,128] op()'  # Layouts left out.
  assert out['ops_share_of_wall'] == pytest.approx(100 / 200)


def test_categories_by_name_where_the_trace_has_none():
  c = profile_summary.category
  assert [c('dot.3'), c('convolution.1'), c('copy.2'), c('transpose.4'), c('fusion.9'),
          c('all-gather-start.1'), c('infeed.2'), c('while.5'), c('custom-call.3')] == [
              'matmul', 'matmul', 'copy', 'copy', 'fusion', 'collective', 'host', 'control',
              'other_custom_call']
  assert c('custom-call.3', 'custom-call', '%x = custom-call(), custom_call_target="tpu_custom_call"'
           ) == 'attention'


def test_summary_of_a_real_trace_on_this_host_finds_its_ops(tmp_path):
  # Off TPU the ops are the host events named like HLO instructions (XLA:CPU names its matmul
  # fusions ynn_fusion, so no category is asserted here).
  import jax
  import jax.numpy as jnp
  w = jnp.ones((512, 512))
  step = jax.jit(lambda x: jnp.tanh(x @ w) @ w.T)
  x = jnp.ones((512, 512))
  wall = profile_summary.trace(lambda: step(x), tmp_path, steps=2)
  out = profile_summary.summarize(tmp_path, steps=2, wall_s=wall)
  assert out['ops_ms_per_step'] > 0 and len(out['top_ops']) >= 2
  assert sum(row['share'] for row in out['by_category'].values()) == pytest.approx(1, abs=1e-3)
  assert 0 < out['ops_share_of_wall'] <= 1.05
  assert all(r['category'] in profile_summary.CATEGORIES for r in out['top_ops'])
