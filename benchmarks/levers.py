"""The MFU levers: each a named set of --fdl_set overrides and/or environment flags, timed as a
bare jitted train step (benchmarks/accelerator_mfu.py's) of one model. Edit the tables below.

    python benchmarks/levers.py                      # every lever on MODELS[LEVER_MODEL]
    python benchmarks/levers.py --only base,unrolled --model 1b --steps 5
    python benchmarks/levers.py --quick              # tiny shapes on any device (CPU: tests)

Levers with only overrides run one after another in this process (one TPU open, each its own
compile); a lever with `env` runs in a child process (XLA and libtpu read their flags when the
backend starts: XLA_FLAGS for XLA's flags, LIBTPU_INIT_ARGS for the TPU compiler's), its values
appended to this process's. A lever that fails (out of HBM, an unknown flag) is reported with
its one-line error and the rest still run. After each lever the whole result so far is printed
as one JSON line (the last line is the full result: a run killed at its time limit keeps what
it measured). Per lever: bare steps/s, tokens/s, MFU and `vs_base` (tokens/s over the `base`
lever's).

MODELS also holds the shapes the MFU parts of benchmarks/device_check.sh run (`mfu_350m`,
`mfu_1b`): the experiment and the overrides that fit one TPU v5e chip (15.75 GiB of HBM).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import common  # noqa: E402

# name: (experiment, overrides). Seq 2048 is the presets' own. lm.Llama350M ran out of HBM at
# batch 8 with 'dots' remat and ran at batch 4 (issue 67); lm.Llama1B (TinyLlama-1.1B shapes:
# 22 × 2048, 32 heads, 4 kv heads, d_ff 5632, vocab 32000) did not fit at batch 4 with float32
# params and Adam moments: add the option that fits (bf16 moments, Adafactor) here when it lands.
MODELS: dict[str, tuple[str, list[str]]] = {
    '350m': ('lm.Llama350M', ['data.batch_size=4', 'data.seq_len=2048']),
    '1b': ('lm.Llama1B', ['data.batch_size=4', 'data.seq_len=2048', 'model.remat_policy=full']),
}
LEVER_MODEL = '350m'

# name: (overrides on top of the model's, env). remat policies: paxlike/layers/lm_checks.py
# REMAT_POLICIES ('none', 'full', 'dots'); attention: model.attention_impl ('auto' picks splash
# on a TPU, 'xla'); layers: model.scan_layers.
LEVERS: dict[str, tuple[list[str], dict[str, str]]] = {
    'base': ([], {}),
    'batch_2': (['data.batch_size=2'], {}),
    'batch_8_remat_full': (['data.batch_size=8', 'model.remat_policy=full'], {}),
    'remat_full': (['model.remat_policy=full'], {}),
    'remat_none_batch_2': (['model.remat_policy=none', 'data.batch_size=2'], {}),
    'unrolled_layers': (['model.scan_layers=False'], {}),
    'attention_xla': (['model.attention_impl=xla'], {}),
    'xla_latency_hiding': ([], {'LIBTPU_INIT_ARGS': '--xla_tpu_enable_latency_hiding_scheduler=true'}),
}

QUICK_LEVERS = ('base', 'remat_full', 'xla_latency_hiding')  # --quick: one of each kind.


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model', default=LEVER_MODEL, choices=sorted(MODELS))
  parser.add_argument('--only', help='comma-separated lever names (default: all)')
  parser.add_argument('--steps', type=int, default=5)
  parser.add_argument('--warmup', type=int, default=1)
  parser.add_argument('--time-limit', type=float, default=86400.0,
                      help='seconds: levers not started by then are reported as skipped')
  parser.add_argument('--peak-tflops', type=float)
  parser.add_argument('--quick', action='store_true', help='tiny shapes, 3 levers (tests)')
  args = parser.parse_args(argv)
  names = args.only.split(',') if args.only else list(QUICK_LEVERS if args.quick else LEVERS)
  unknown = [n for n in names if n not in LEVERS]
  if unknown:
    parser.error(f'unknown lever(s) {", ".join(unknown)}; known: {", ".join(LEVERS)}')
  args.names = names
  return args


def overrides(args: argparse.Namespace, name: str) -> list[str]:
  """The model's overrides, then the lever's (then the quick shapes, which win)."""
  from benchmarks import accelerator_mfu
  quick = accelerator_mfu.QUICK_LM if args.quick else []
  return [*MODELS[args.model][1], *LEVERS[name][0], *quick]


def in_process(args: argparse.Namespace, name: str, peak: float | None) -> dict[str, Any]:
  from benchmarks import accelerator_mfu
  mfu_args = argparse.Namespace(quick=args.quick, donate=True, warmup=args.warmup,
                                steps=args.steps, profile=None)
  task = accelerator_mfu.task_of(MODELS[args.model][0], [], overrides(args, name))
  return accelerator_mfu.measure(task, mfu_args, peak, trainer=False)


def in_child(args: argparse.Namespace, name: str, time_left: float) -> dict[str, Any]:
  """The lever in a child process with its environment flags appended to ours."""
  env = common.child_env()
  for key, value in LEVERS[name][1].items():
    env[key] = f'{env.get(key, "")} {value}'.strip()
  cmd = [sys.executable, 'benchmarks/accelerator_mfu.py', '--only=bare',
         f'--exp={MODELS[args.model][0]}', f'--steps={args.steps}', f'--warmup={args.warmup}',
         *[f'--fdl_set={o}' for o in overrides(args, name)],
         *(['--quick'] if args.quick else []),
         *([f'--peak-tflops={args.peak_tflops}'] if args.peak_tflops else [])]
  try:
    proc = subprocess.run(cmd, cwd=common.REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=max(time_left, 1))
  except subprocess.TimeoutExpired:
    return {'bare_error': f'time limit ({int(time_left)} s)'}
  lines = proc.stdout.strip().splitlines()
  if proc.returncode or not lines:
    err = [l for l in proc.stderr.splitlines() if l.strip()]
    return {'bare_error': f'exit {proc.returncode}: {err[-1][-300:] if err else ""}'}
  return json.loads(lines[-1])['lm']


def row_of(name: str, measured: dict[str, Any]) -> dict[str, Any]:
  row = {'overrides': LEVERS[name][0], 'env': LEVERS[name][1]}
  keep = ('bare_mfu', 'bare_steps_per_sec', 'bare_error', 'bare_setup_s', 'batch_size',
          'remat_policy', 'scan_layers', 'attention_kernel')
  row.update({k: measured[k] for k in keep if k in measured})
  if 'bare_steps_per_sec' in measured:
    row['tokens_per_sec'] = (measured['bare_steps_per_sec'] * measured['batch_size']
                             * measured['seq_len'])
  return row


def main(argv: list[str] | None = None) -> int:
  args = parse_args(argv)
  began = time.time()
  import jax
  from paxlike.trainer import throughput
  device = jax.devices()[0]
  peak = (args.peak_tflops * 1e12 if args.peak_tflops
          else throughput.peak_flops_per_sec(device.device_kind))
  exp, base_overrides = MODELS[args.model]
  out: dict[str, Any] = {'benchmark': 'levers', 'quick': args.quick, 'model': args.model,
                         'exp': exp, 'model_overrides': base_overrides,
                         'device_kind': device.device_kind, 'levers': {}}
  for name in args.names:
    left = args.time_limit - (time.time() - began)
    if left < 20:
      out['levers'][name] = {'skipped': 'time limit'}
      continue
    common.log(f'levers: {name} ({int(left)} s left)')
    measured = (in_child(args, name, left) if LEVERS[name][1]
                else in_process(args, name, peak))
    out['levers'][name] = row_of(name, measured)
    base = out['levers'].get('base', {}).get('tokens_per_sec')
    for row in out['levers'].values():
      if base and row.get('tokens_per_sec'):
        row['vs_base'] = round(row['tokens_per_sec'] / base, 4)
    common.emit(out)
  if not args.names:
    common.emit(out)
  return 0


if __name__ == '__main__':
  sys.exit(main())
