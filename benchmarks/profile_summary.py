"""Where a step's device time goes: a `jax.profiler` trace summarized by XLA op and by category.

Not a benchmark itself (running it as a script summarizes a trace directory you name):

    python -m benchmarks.profile_summary DIR [--steps N] [--top 25]

`trace(fn, directory, steps)` runs `fn()` `steps` times (≤ 2 in flight) under
`jax.profiler.trace(create_perfetto_trace=True)`; `summarize(directory, steps)` reads the
perfetto trace (`*.trace.json.gz`, plain JSON: no TensorBoard or xprof needed) that JAX writes.

On a TPU (seen on JAX 0.10.2, v5e) the device's ops are events on the "/device:TPU:0" process's
"XLA Ops" threads, each with `hlo_category` ('convolution fusion', 'loop fusion', 'custom-call',
'data formatting', ...), `long_name` (the HLO instruction) and `model_flops`. A `while` (scanned
layers) spans its body's ops on the same thread, so times here are self times: an op's duration
less its children's. Off TPU (CPU: the suite's check) there are no device threads; the ops are
then the host events named like HLO instructions (`fusion.3`, `dot.1`, `copy.2`), categorized by
name. Categories: matmul (convolution/dot fusions), attention (splash / Pallas custom calls),
other_custom_call, fusion (loop/input/output fusions and elementwise), copy (copies, transposes,
layout changes), collective, host (infeed, outfeed, send/recv, host transfers), control (while,
conditional, call: self time only).
"""

from __future__ import annotations

import collections
import gzip
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

from benchmarks import common

CATEGORIES = ('matmul', 'attention', 'other_custom_call', 'fusion', 'copy', 'collective', 'host',
              'control')
_COLLECTIVE = ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all', 'collective-permute',
               'collective', 'send', 'recv')
_HOST = ('infeed', 'outfeed', 'host', 'send-done', 'recv-done')
_KERNEL = ('splash', 'pallas', 'mosaic', 'flash', 'attention', 'tpu_custom_call')


def category(name: str, hlo_category: str = '', long_name: str = '') -> str:
  """One of CATEGORIES for an op, from the profiler's `hlo_category` where there is one (TPU),
  else from the instruction's name."""
  cat, base = hlo_category.lower(), re.sub(r'[.\d]+$', '', name.lower())
  text = f'{cat} {base}'
  if any(k in text for k in _HOST) or base.startswith(('infeed', 'outfeed')):
    return 'host'
  if any(k in text for k in _COLLECTIVE):
    return 'collective'
  if 'custom-call' in cat or 'custom' in base or base.startswith(('pallas', 'splash')):
    kernel = any(k in f'{base} {long_name.lower()}' for k in _KERNEL)
    return 'attention' if kernel else 'other_custom_call'
  if 'convolution' in text or 'dot' in base.split('_') or base.startswith(('dot', 'gemm')):
    return 'matmul'
  if base.startswith(('while', 'conditional', 'call')) or cat in ('while', 'conditional'):
    return 'control'
  if ('data formatting' in cat or base.startswith(('copy', 'transpose', 'bitcast'))
      or cat in ('copy-start', 'copy-done')):
    return 'copy'
  return 'fusion'


def trace(fn: Callable[[], Any], directory: Path, steps: int) -> float:
  """Runs `fn()` `steps` times (≤ 2 in flight) under the profiler; returns the wall seconds."""
  import jax
  jax.block_until_ready(fn())  # Compiled and warm before the trace starts.
  with jax.profiler.trace(str(directory), create_perfetto_trace=True):
    return common.timed_loop(fn, steps)


def _events(directory: Path) -> list[dict[str, Any]]:
  """The newest perfetto trace's events under `directory`."""
  paths = sorted(Path(directory).rglob('*.trace.json.gz'), key=lambda p: p.stat().st_mtime)
  if not paths:
    raise FileNotFoundError(f'no *.trace.json.gz under {directory}')
  trace_json = json.loads(gzip.open(paths[-1]).read())
  return trace_json['traceEvents'] if isinstance(trace_json, dict) else trace_json


_HLO_NAME = re.compile(r'^[a-z][\w\-]*(\.\d+)*$')
_NOT_OPS = ('ThreadPool', 'PjitFunction', 'Execute', 'Mutex', 'Thunk')


def op_events(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
  """(the op events, 'device' or 'host'): the XLA Ops threads of device processes where there
  are any, else host events named like HLO instructions."""
  process = {e['pid']: e['args']['name'] for e in events
             if e.get('ph') == 'M' and e.get('name') == 'process_name'}
  thread = {(e['pid'], e.get('tid')): e['args']['name'] for e in events
            if e.get('ph') == 'M' and e.get('name') == 'thread_name'}
  timed = [e for e in events if e.get('ph') == 'X' and 'dur' in e]
  device = [e for e in timed if process.get(e['pid'], '').startswith('/device:')
            and 'XLA Ops' in thread.get((e['pid'], e.get('tid')), '')]
  if device:
    return device, 'device'
  host = [e for e in timed if _HLO_NAME.match(e.get('name', ''))
          and not any(k in e['name'] for k in _NOT_OPS)]
  return host, 'host'


def self_times(events: list[dict[str, Any]]) -> list[tuple[dict[str, Any], float]]:
  """(event, its duration less its direct children's on the same thread), in µs."""
  out = []
  by_thread: dict[Any, list[dict[str, Any]]] = collections.defaultdict(list)
  for e in events:
    by_thread[(e['pid'], e.get('tid'))].append(e)
  for thread_events in by_thread.values():
    thread_events.sort(key=lambda e: (e['ts'], -e['dur']))
    stack: list[list[Any]] = []  # [event, end, children's time]
    for e in thread_events:
      while stack and e['ts'] >= stack[-1][1] - 1e-6:
        done = stack.pop()
        out.append((done[0], max(done[0]['dur'] - done[2], 0.0)))
      if stack:
        stack[-1][2] += e['dur']
      stack.append([e, e['ts'] + e['dur'], 0.0])
    out.extend((done[0], max(done[0]['dur'] - done[2], 0.0)) for done in stack)
  return out


def summarize(directory: Path, steps: int, top: int = 25, wall_s: float | None = None
              ) -> dict[str, Any]:
  """Device time per step by category and the `top` ops by total self time (see the module
  docstring); `wall_s`: the traced steps' wall time, to show how much of it no op covers."""
  events, source = op_events(_events(directory))
  ops: dict[str, dict[str, Any]] = {}
  for e, self_us in self_times(events):
    args = e.get('args', {})
    op = ops.setdefault(e['name'], {
        'category': category(e['name'], args.get('hlo_category', ''), args.get('long_name', '')),
        'hlo_category': args.get('hlo_category'), 'count': 0, 'us': 0.0, 'flops': 0.0,
        'hlo': _short(args.get('long_name', ''))})
    op['count'] += 1
    op['us'] += self_us
    op['flops'] += float(args.get('model_flops', 0) or 0)
  total_us = sum(op['us'] for op in ops.values())
  by_category = {c: {'ms_per_step': 0.0, 'ops': 0} for c in CATEGORIES}
  for op in ops.values():
    by_category[op['category']]['ms_per_step'] += op['us'] / 1e3 / steps
    by_category[op['category']]['ops'] += 1
  for row in by_category.values():
    row['share'] = round(row['ms_per_step'] * 1e3 * steps / total_us, 4) if total_us else 0.0
    row['ms_per_step'] = round(row['ms_per_step'], 4)
  ranked = sorted(ops.items(), key=lambda kv: -kv[1]['us'])[:top]
  out: dict[str, Any] = {
      'source': source, 'steps': steps, 'ops_ms_per_step': round(total_us / 1e3 / steps, 3),
      'by_category': by_category, 'top_ops': [_op_row(name, op, steps, total_us)
                                              for name, op in ranked]}
  if wall_s:
    out['wall_ms_per_step'] = round(wall_s * 1e3 / steps, 3)
    out['ops_share_of_wall'] = round(total_us / 1e6 / wall_s, 4)
  return out


def _short(long_name: str) -> str | None:
  """The HLO instruction without its layouts ({1,0:T(8,128)...}), cut to 200 characters."""
  for _ in range(3):
    long_name = re.sub(r'\{[^{}]*\}', '', long_name)
  return long_name[:200] or None


def _op_row(name: str, op: dict[str, Any], steps: int, total_us: float) -> dict[str, Any]:
  row = {'name': name, 'category': op['category'], 'hlo_category': op['hlo_category'],
         'count_per_step': op['count'] / steps, 'ms_per_step': round(op['us'] / 1e3 / steps, 4),
         'share': round(op['us'] / total_us, 4) if total_us else 0.0}
  if op['flops'] and op['us']:
    row['tflops_per_sec'] = round(op['flops'] / (op['us'] * 1e-6) / 1e12, 1)
  row['hlo'] = op['hlo']
  return row


if __name__ == '__main__':
  if len(sys.argv) > 1:
    import argparse
    parser = argparse.ArgumentParser(description='Summarize a jax.profiler trace directory.')
    parser.add_argument('directory', type=Path)
    parser.add_argument('--steps', type=int, default=1)
    parser.add_argument('--top', type=int, default=25)
    cli = parser.parse_args()
    print(json.dumps(summarize(cli.directory, cli.steps, cli.top)))
