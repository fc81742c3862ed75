"""paxlike's trainer (`lm.TextLM`) against MaxText 0.2.5's own trainer, whole runs on CPU.

  python benchmarks/peers/maxtext_step.py [--meshes 1dev fsdp8 dp8] [--pairs 3] [--steps 20]
      [--model small|large] [--peer_python .venv-peers/bin/python] [--dump_hlo DIR]
      [--hardware cpu|gpu]

The same Llama-style model on both sides, float32, no scan, no remat, untied embeddings:
`small` is 4 layers, d 256, 4 query / 2 kv heads of 64, SwiGLU 704, vocab 2,048, seq 256,
global batch 8 (4.0 M params); `large` is 8 layers, d 512, 8 / 4 heads, SwiGLU 1,408, seq 512,
global batch 4 (8 on the 8-device meshes). Meshes: `1dev` (one CPU device), `fsdp8` (8
forced CPU devices, all on 'fsdp': MaxText `ici_fsdp_parallelism=-1`, paxlike
`mesh.axes=('fsdp',)`) and `dp8` (all 8 on 'data'). MaxText runs `python -m maxtext.trainers.pre_train.train base.yml` in the peers'
environment (`make peers`) with `hardware=cpu`, synthetic data and its checkpoints off;
paxlike runs `python -m paxlike.main --exp=lm.TextLM` (Tiny Shakespeare, bytes, its data
pipeline in the loop) with checkpoints and eval out of the timed steps. Each system's step time
is the median over the steps after `--skip` of what its own logs say (MaxText's `completed
step: N, seconds: S`, paxlike's metrics.jsonl `steps_per_sec`). Pairs interleave the systems
(A B, B A, ...). Prints one JSON object: per mesh both systems' steps/s (median over pairs)
and `ratio` (paxlike / MaxText steps/s, the median of the pairs' ratios).
`--hardware gpu` runs both on the first GPU instead (mesh `1dev` only; MaxText `hardware=gpu`,
no forced CPU devices), with `--pax_python` and `--peer_python` the interpreters there.
`--dump_hlo DIR` also passes `--xla_dump_to` to each run (DIR/<mesh>/<system>) for the HLO
comparison; dumping slows compilation, not the steps.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
MODELS = {
    'small': dict(layers=4, d_model=256, heads=4, kv_heads=2, head_dim=64, d_ff=704,
                  vocab=2048, seq=256, batch=8),
    'large': dict(layers=8, d_model=512, heads=8, kv_heads=4, head_dim=64, d_ff=1408,
                  vocab=2048, seq=512, batch=4),
}
MESHES = {'1dev': (1, 'fsdp'), 'fsdp8': (8, 'fsdp'), 'dp8': (8, 'data')}
STEP_LINE = re.compile(r'completed step: (\d+), seconds: ([\d.]+)'
                       r'(?:, TFLOP/s/device: [\d.]+, Tokens/s/device: ([\d.]+))?')


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--meshes', nargs='+', default=list(MESHES), choices=list(MESHES))
  parser.add_argument('--model', default='small', choices=list(MODELS))
  parser.add_argument('--pairs', type=int, default=3)
  parser.add_argument('--steps', type=int, default=20, help='steps per whole run')
  parser.add_argument('--skip', type=int, default=3, help='first steps left out (compile)')
  parser.add_argument('--peer_python', default=str(REPO / '.venv-peers/bin/python'))
  parser.add_argument('--pax_python', default=str(REPO / '.venv/bin/python'))
  parser.add_argument('--set', action='append', default=[], metavar='PATH=VALUE',
                      help='extra paxlike override (repeatable), e.g. to try a change')
  parser.add_argument('--dump_hlo', type=Path, help='write each run\'s XLA dump under DIR')
  parser.add_argument('--hardware', default='cpu', choices=['cpu', 'gpu'])
  parser.add_argument('--work', type=Path, default=Path(tempfile.gettempdir()) / 'paxlike_mt')
  args = parser.parse_args(argv)
  if args.hardware == 'gpu' and args.meshes != ['1dev']:
    parser.error('--hardware gpu runs on one GPU: use --meshes 1dev')
  return args


def global_batch(model: str, mesh: str) -> int:
  """The model's global batch, raised to the mesh's device count where it is smaller (the
  large model's 4 rows on 8 devices: paxlike splits a batch only whole rows per device)."""
  return max(MODELS[model]['batch'], MESHES[mesh][0])


def maxtext_settings(model: str, mesh: str, steps: int, out: Path,
                     hardware: str = 'cpu') -> dict[str, Any]:
  """MaxText's `key=value` settings for `model` on `mesh`: the same global batch as paxlike's
  (per-device batch x devices), on `hardware`, synthetic data, no checkpoints, scan, remat or
  tensorboard."""
  m, (devices, axis) = MODELS[model], MESHES[mesh]
  parallel = ({'ici_fsdp_parallelism': -1, 'ici_data_parallelism': 1} if axis == 'fsdp'
              else {'ici_fsdp_parallelism': 1, 'ici_data_parallelism': -1})
  return dict(
      run_name='peer', base_output_directory=out, hardware=hardware,
      skip_jax_distributed_system='true', dataset_type='synthetic', jax_cache_dir='',
      steps=steps, enable_checkpointing='false', enable_tensorboard='false',
      log_period=10**6, per_device_batch_size=global_batch(model, mesh) / devices,
      max_target_length=m['seq'], base_emb_dim=m['d_model'], base_num_query_heads=m['heads'],
      base_num_kv_heads=m['kv_heads'], head_dim=m['head_dim'], base_mlp_dim=m['d_ff'],
      base_num_decoder_layers=m['layers'], vocab_size=m['vocab'], dtype='float32',
      weight_dtype='float32', scan_layers='false', remat_policy='none',
      attention='dot_product', dcn_data_parallelism=1, **parallel)


def maxtext_command(args: argparse.Namespace, mesh: str, out: Path) -> list[str]:
  """MaxText's trainer (its base.yml, found in the peers' environment) on `mesh`."""
  base = subprocess.run(
      [args.peer_python, '-c', 'import importlib.util as u; '
       'print(u.find_spec("maxtext").submodule_search_locations[0])'],
      capture_output=True, text=True, check=True).stdout.strip() + '/configs/base.yml'
  settings = maxtext_settings(args.model, mesh, args.steps, out, args.hardware)
  return [args.peer_python, '-m', 'maxtext.trainers.pre_train.train', base,
          *(f'{k}={v}' for k, v in settings.items())]


def paxlike_command(args: argparse.Namespace, mesh: str, out: Path) -> list[str]:
  """paxlike's CLI training lm.TextLM on `mesh` with the model of `args.model`."""
  m, (_, axis) = MODELS[args.model], MESHES[mesh]
  sets = {'model.num_layers': m['layers'], 'model.d_model': m['d_model'],
          'model.num_heads': m['heads'], 'model.num_kv_heads': m['kv_heads'],
          'model.d_ff': m['d_ff'], 'model.vocab_size': m['vocab'], 'model.max_len': m['seq'],
          'data.seq_len': m['seq'], 'data.batch_size': global_batch(args.model, mesh),
          'train.num_steps': args.steps, 'train.log_every': 1,
          'train.checkpoint_every': 10**6, 'train.eval_every': 10**6,
          'mesh.axes': f"('{axis}',)"}
  return [args.pax_python, '-m', 'paxlike.main', '--exp=lm.TextLM', f'--job_log_dir={out}',
          *(f'--fdl_set={k}={v}' for k, v in sets.items()), *(f'--fdl_set={s}' for s in args.set)]


def run(cmd: list[str], devices: int, dump: Path | None, hardware: str = 'cpu') -> str:
  """Runs one whole training process, on `devices` forced CPU devices or on the GPU; its
  output."""
  flags = [f'--xla_force_host_platform_device_count={devices}'] if hardware == 'cpu' else []
  if dump is not None:
    flags += [f'--xla_dump_to={dump}', '--xla_dump_hlo_as_text',
              '--xla_dump_hlo_module_re=.*train_step.*|.*jit_step.*|.*_step.*']
  path = os.pathsep.join(filter(None, [str(REPO), os.environ.get('PYTHONPATH')]))
  env = {**os.environ, 'XLA_FLAGS': ' '.join(flags), 'DECOUPLE_GCLOUD': 'TRUE',
         'PYTHONPATH': path, 'JAX_PLATFORMS': 'cpu'}
  if hardware != 'cpu':
    del env['JAX_PLATFORMS']
  proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
  if proc.returncode:
    raise SystemExit(f'{" ".join(cmd[:3])} failed ({proc.returncode}): {proc.stderr[-3000:]}')
  return proc.stdout + proc.stderr


def maxtext_steps_per_sec(log: str, skip: int, tokens_per_device: int) -> float:
  """1 / the median of MaxText's step seconds after the first `skip` steps: from its
  Tokens/s/device where the line has it (the seconds it prints have 3 decimals, too coarse for
  a GPU's few-millisecond steps), else the printed seconds."""
  seconds = [tokens_per_device / float(rate) if rate else float(s)
             for n, s, rate in STEP_LINE.findall(log) if int(n) >= skip]
  if not seconds:
    raise SystemExit(f'no MaxText step lines after step {skip} in its log')
  return 1 / statistics.median(seconds)


def paxlike_steps_per_sec(job: Path, skip: int) -> float:
  """The median of metrics.jsonl's steps_per_sec after `skip` steps (the row with the final
  eval left out)."""
  rows = [json.loads(line) for line in (job / 'metrics.jsonl').read_text().splitlines()]
  rates = [r['steps_per_sec'] for r in rows if r['step'] > skip and 'eval_loss' not in r]
  if not rates:
    raise SystemExit(f'no paxlike rows after step {skip} in {job}')
  return statistics.median(rates)


def one_run(system: str, mesh: str, args: argparse.Namespace, index: int) -> float:
  """Steps/s of one whole run of `system` on `mesh`."""
  out = args.work / f'{mesh}_{system}_{index}'
  subprocess.run(['rm', '-rf', str(out)], check=True)
  dump = args.dump_hlo / mesh / system if args.dump_hlo and index == 0 else None
  devices = MESHES[mesh][0]
  if system == 'maxtext':
    m = MODELS[args.model]
    return maxtext_steps_per_sec(run(maxtext_command(args, mesh, out), devices, dump,
                                     args.hardware), args.skip,
                                 global_batch(args.model, mesh) * m['seq'] // devices)
  run(paxlike_command(args, mesh, out), devices, dump, args.hardware)
  return paxlike_steps_per_sec(out, args.skip)


def compare(mesh: str, args: argparse.Namespace) -> dict[str, Any]:
  """Both systems' steps/s over interleaved pairs and the paired ratio."""
  rates: dict[str, list[float]] = {'paxlike': [], 'maxtext': []}
  for i in range(args.pairs):
    for system in (['paxlike', 'maxtext'] if i % 2 == 0 else ['maxtext', 'paxlike']):
      start = time.perf_counter()
      rates[system].append(one_run(system, mesh, args, i))
      print(f'{mesh} pair {i + 1} {system}: {rates[system][-1]:.3f} steps/s '
            f'({time.perf_counter() - start:.0f} s, load {os.getloadavg()[0]:.1f})',
            file=sys.stderr, flush=True)
  return {
      **{f'{k}_steps_per_sec': round(statistics.median(v), 3) for k, v in rates.items()},
      **{f'{k}_all': [round(x, 3) for x in v] for k, v in rates.items()},
      'ratio': round(statistics.median(p / m for p, m in zip(rates['paxlike'],
                                                              rates['maxtext'])), 2)}


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  args.work.mkdir(parents=True, exist_ok=True)
  load = round(os.getloadavg()[0], 2)
  results = {mesh: compare(mesh, args) for mesh in args.meshes}
  print(json.dumps({'benchmark': 'peers/maxtext_step', 'hardware': args.hardware,
                    'model': MODELS[args.model],
                    'steps': args.steps, 'skip': args.skip, 'pairs': args.pairs,
                    'paxlike_overrides': args.set, 'cpu_count': os.cpu_count(),
                    'load_avg_1m_start': load, **results}, indent=1))


if __name__ == '__main__':
  main()
