"""The MFU levers: each a named set of --fdl_set overrides, fiddlers and environment flags,
timed as a bare jitted train step (benchmarks/accelerator_mfu.py's) of one model. Edit the
tables below.

    python -m benchmarks.levers                      # every lever on MODELS[LEVER_MODEL]
    python -m benchmarks.levers --only base,unrolled_layers --model 1b --steps 5
    python -m benchmarks.levers --quick              # tiny shapes on any device (CPU: tests)

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
from typing import Any, NamedTuple

from benchmarks import common
from paxlike.configs import sizes


class Lever(NamedTuple):
  """Overrides on top of the model's, paxlike/configs/fiddlers.py names applied before them, and
  environment flags (a lever with flags runs in a child process)."""

  overrides: tuple[str, ...] = ()
  env: dict[str, str] = {}
  fiddlers: tuple[str, ...] = ()


def _fit(exp: str, size: str) -> tuple[str, list[str]]:
  """The experiment at seq 2048 as paxlike/configs/sizes.py CHIP_16GB fits it on one chip."""
  fit = sizes.CHIP_16GB[size]
  return exp, [f'data.batch_size={fit.batch}', 'data.seq_len=2048',
               f'model.remat_policy={fit.remat_policy}',
               *(['model.param_dtype=bfloat16'] if fit.bf16_params else [])]


# name: (experiment, overrides): the presets at seq 2048 as they fit one TPU v5e chip.
MODELS: dict[str, tuple[str, list[str]]] = {
    '350m': _fit('lm.Llama350M', '350m'),
    '1b': _fit('lm.Llama1B', '1b'),
}
LEVER_MODEL = '350m'

# Each model's levers (the first is the base the others are compared with). remat policies:
# paxlike/layers/lm_checks.py REMAT_POLICIES; attention: model.attention_impl ('auto' picks
# splash on a TPU, 'xla'); layers: model.scan_layers; fiddlers: paxlike/configs/fiddlers.py.
LATENCY_HIDING = {'LIBTPU_INIT_ARGS': '--xla_tpu_enable_latency_hiding_scheduler=true'}
LEVERS: dict[str, dict[str, Lever]] = {
    '350m': {
        'base': Lever(),
        # The shape the preset had until the fifth TPU session: 16 heads of 64 (the same params
        # and FLOPs; twice the attention scores, where a TPU's attention kernel spends its time).
        'heads_16x64': Lever(('model.num_heads=16',)),
        # The fit with a float32 copy of the params (and float32 Adam moments).
        'float32_params_batch_4': Lever(('data.batch_size=4', 'model.param_dtype=float32')),
        'adafactor': Lever(fiddlers=('adafactor',)),
        'batch_8_remat_dots': Lever(('data.batch_size=8', 'model.remat_policy=dots')),
        'batch_16_remat_full': Lever(('data.batch_size=16', 'model.remat_policy=full')),
        'remat_dots': Lever(('model.remat_policy=dots',)),
        'remat_full': Lever(('model.remat_policy=full',)),
        'unrolled_layers': Lever(('model.scan_layers=False',)),
        'attention_xla': Lever(('model.attention_impl=xla',)),
        'xla_latency_hiding': Lever(env=LATENCY_HIDING),
    },
    # At batch 4, AdamW's bf16 state (8.8 GB with the params) leaves room for 'full' remat
    # only; Adafactor's factored state frees ~4 GB for 'dots' (docs/benchmarks.md: each MFU).
    '1b': {
        'base': Lever(),
        'batch_4_remat_full': Lever(('data.batch_size=4', 'model.remat_policy=full')),
        'remat_dots': Lever(('model.remat_policy=dots',)),
        'adafactor_batch_4_remat_dots': Lever(('data.batch_size=4', 'model.remat_policy=dots'),
                                              fiddlers=('adafactor',)),
        'adafactor_batch_4': Lever(('data.batch_size=4',), fiddlers=('adafactor',)),
        'adafactor_batch_8_remat_full': Lever(('data.batch_size=8', 'model.remat_policy=full'),
                                              fiddlers=('adafactor',)),
        'unrolled_layers': Lever(('model.scan_layers=False',)),
    },
}

# --quick: three levers of different kinds (overrides, a fiddler, a child with flags).
QUICK_LEVERS = {'350m': ('base', 'remat_full', 'xla_latency_hiding'),
                '1b': ('base', 'remat_dots', 'adafactor_batch_4')}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = common.parser(__doc__, 'tiny shapes, 3 levers (tests)')
  parser.add_argument('--model', default=LEVER_MODEL, choices=sorted(MODELS))
  parser.add_argument('--only', help='comma-separated lever names (default: all)')
  parser.add_argument('--steps', type=int, default=5)
  parser.add_argument('--warmup', type=int, default=1)
  parser.add_argument('--time-limit', type=float, default=86400.0,
                      help='seconds: levers not started by then are reported as skipped')
  parser.add_argument('--peak-tflops', type=float)
  args = parser.parse_args(argv)
  table = LEVERS[args.model]
  names = (args.only.split(',') if args.only
           else list(QUICK_LEVERS[args.model] if args.quick else table))
  unknown = [n for n in names if n not in table]
  if unknown:
    parser.error(f'unknown lever(s) {", ".join(unknown)} for --model {args.model}; '
                 f'known: {", ".join(table)}')
  args.names = names
  return args


def overrides(args: argparse.Namespace, name: str) -> list[str]:
  """The model's overrides, then the lever's (then the quick shapes, which win)."""
  from benchmarks import accelerator_mfu
  quick = accelerator_mfu.QUICK_LM if args.quick else []
  return [*MODELS[args.model][1], *LEVERS[args.model][name].overrides, *quick]


def in_process(args: argparse.Namespace, name: str, peak: float | None) -> dict[str, Any]:
  from benchmarks import accelerator_mfu
  mfu_args = argparse.Namespace(quick=args.quick, donate=True, warmup=args.warmup,
                                steps=args.steps, profile=None)
  task = accelerator_mfu.task_of(MODELS[args.model][0], list(LEVERS[args.model][name].fiddlers),
                                 overrides(args, name))
  return accelerator_mfu.measure(task, mfu_args, peak, trainer=False)


def in_child(args: argparse.Namespace, name: str, time_left: float) -> dict[str, Any]:
  """The lever in a child process with its environment flags appended to ours."""
  env = common.child_env()
  lever = LEVERS[args.model][name]
  for key, value in lever.env.items():
    env[key] = f'{env.get(key, "")} {value}'.strip()
  cmd = [sys.executable, '-m', 'benchmarks.accelerator_mfu', '--only=bare',
         f'--exp={MODELS[args.model][0]}', f'--steps={args.steps}', f'--warmup={args.warmup}',
         *[f'--fdl_set={o}' for o in overrides(args, name)],
         *[f'--fiddler={f}' for f in lever.fiddlers],
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


def row_of(lever: Lever, measured: dict[str, Any]) -> dict[str, Any]:
  row = {'overrides': list(lever.overrides), 'env': lever.env, 'fiddlers': list(lever.fiddlers)}
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
    lever = LEVERS[args.model][name]
    measured = in_child(args, name, left) if lever.env else in_process(args, name, peak)
    out['levers'][name] = row_of(lever, measured)
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
