"""A LoRA step and a full fine-tune step: paxlike against PEFT and plain PyTorch on CPU.

  python benchmarks/peers/peft_lora.py [--threads 1 2] [--repeats 3] [--steps 8]
      [--peer_python .venv-peers/bin/python] [--quick]

The issue's 4-layer d256 Llama on both sides (vocab 2,048, 4 query / 2 kv heads, SwiGLU 704,
RMSNorm, rope, untied; float32), AdamW (lr 1e-3, weight decay 1e-4) on random tokens:
- `full`: every param trained. paxlike: `centralized(loss, adamw)` of `TransformerLM`, jitted
  with donation, at most 2 steps in flight (the trainer's step). PyTorch: transformers'
  `LlamaForCausalLM`, forward, cross-entropy, backward, `AdamW.step`.
- `lora`: rank-8 adapters (alpha 16) on the query and value projections, only they trained.
  paxlike: `model.lora_rank=8` with `trainable=lora_mask`; PyTorch: PEFT's `get_peft_model`
  with `target_modules=['q_proj', 'v_proj']`.
Every measurement is a fresh child process, pinned to `threads` cores (`sched_setaffinity`,
and `torch.set_num_threads`), so its peak resident memory (`ru_maxrss`) is that job's alone:
paxlike's children run in this checkout's .venv, the peers' in `--peer_python` (`make peers`).
Repeats interleave the two systems (A B, B A, ...). Prints one JSON object: per mode and thread
count both systems' median ms per step and peak MiB, `speedup` (PyTorch ms / paxlike ms, the
median of the repeats' pairs) and `memory_ratio` (paxlike / PyTorch peak MiB).
The parent imports neither jax nor torch; run it with either environment's Python.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SHAPE = dict(vocab=2048, layers=4, d_model=256, heads=4, kv_heads=2, d_ff=704)
QUICK_SHAPE = dict(vocab=256, layers=1, d_model=32, heads=4, kv_heads=2, d_ff=64)
RANK, ALPHA, LR, WEIGHT_DECAY = 8, 16.0, 1e-3, 1e-4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--threads', type=int, nargs='+', default=[1, 2])
  parser.add_argument('--modes', nargs='+', default=['lora', 'full'], choices=['lora', 'full'])
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--steps', type=int, default=8, help='timed steps per child')
  parser.add_argument('--warmup', type=int, default=2, help='untimed steps first (compile)')
  parser.add_argument('--batch', type=int, default=8)
  parser.add_argument('--seq', type=int, default=256)
  parser.add_argument('--peer_python', default=str(REPO / '.venv-peers/bin/python'))
  parser.add_argument('--pax_python', default=str(REPO / '.venv/bin/python'))
  parser.add_argument('--quick', action='store_true', help='a tiny model, 1 repeat (tests)')
  parser.add_argument('--child', choices=['paxlike', 'torch'], help=argparse.SUPPRESS)
  parser.add_argument('--mode', default='lora', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.quick:
    args.repeats, args.steps, args.warmup, args.batch, args.seq = 1, 2, 1, 2, 16
  args.shape = QUICK_SHAPE if args.quick else SHAPE
  return args


def rss_mb() -> float:
  """This process's resident memory now, in MiB (/proc/self/status VmRSS)."""
  for line in Path('/proc/self/status').read_text().splitlines():
    if line.startswith('VmRSS:'):
      return int(line.split()[1]) / 1024
  return float('nan')


def peak_mb() -> float:
  """This process's peak resident memory so far, in MiB (Linux reports KiB)."""
  import resource  # pylint: disable=import-outside-toplevel
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def tokens(args: argparse.Namespace) -> Any:
  """The same int64 [batch, seq + 1] random tokens for both systems."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  return np.random.default_rng(0).integers(0, args.shape['vocab'], (args.batch, args.seq + 1))


def paxlike_child(args: argparse.Namespace) -> dict[str, Any]:
  """Times paxlike's step (the trainer's centralized algorithm) for `args.mode`."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import optax
  sys.path.insert(0, str(REPO))
  from benchmarks import common
  from paxlike.layers import TransformerLM
  from paxlike.layers.lora import lora_mask
  from paxlike.trainer import losses
  from paxlike.trainer.centralized import centralized
  imported = rss_mb()
  sh = args.shape
  model = TransformerLM(vocab_size=sh['vocab'], num_layers=sh['layers'], d_model=sh['d_model'],
                        num_heads=sh['heads'], num_kv_heads=sh['kv_heads'], d_ff=sh['d_ff'],
                        max_len=args.seq, tied_embeddings=False, norm_eps=1e-5,
                        lora_rank=RANK if args.mode == 'lora' else 0, lora_alpha=ALPHA)
  data = tokens(args)
  batch = {'inputs': jnp.asarray(data[None, None, :, :-1], jnp.int32),
           'targets': jnp.asarray(data[None, None, :, 1:], jnp.int32),
           'mask': jnp.ones((1, 1, args.batch, args.seq), jnp.float32)}
  params = nn.meta.unbox(model.init(jax.random.key(0), batch['inputs'][0, 0, :1])['params'])
  alg = centralized(losses.model_loss_fn(model),
                    optax.adamw(LR, weight_decay=WEIGHT_DECAY),
                    trainable=lora_mask if args.mode == 'lora' else None)
  step = jax.jit(alg.next, donate_argnums=0)
  state = {'s': alg.init(params)}
  del params
  weights, rng = jnp.ones(1), jax.random.key(0)
  losses_seen = []

  def one():
    state['s'], metrics = step(state['s'], batch, weights, rng)
    losses_seen.append(metrics['loss'])
    return metrics['loss']

  common.timed_loop(one, args.warmup)
  seconds = common.timed_loop(one, args.steps)
  trained = jax.tree.leaves(jax.tree.map(
      lambda p, m: p.size if m else 0, state['s'].params,
      lora_mask(state['s'].params) if args.mode == 'lora'
      else jax.tree.map(lambda _: True, state['s'].params)))
  return {'ms_per_step': 1e3 * seconds / args.steps, 'peak_mb': peak_mb(),
          'after_imports_mb': imported, 'trained_params': int(sum(trained)),
          'params': int(sum(x.size for x in jax.tree.leaves(state['s'].params))),
          'first_loss': float(losses_seen[0]), 'last_loss': float(losses_seen[-1])}


def torch_child(args: argparse.Namespace) -> dict[str, Any]:
  """Times transformers' Llama (plain PyTorch, or PEFT LoRA) for `args.mode`."""
  import torch
  import torch.nn.functional as F
  from transformers import LlamaConfig, LlamaForCausalLM
  torch.set_num_threads(args.threads[0])
  imported = rss_mb()
  sh = args.shape
  torch.manual_seed(0)
  model = LlamaForCausalLM(LlamaConfig(
      vocab_size=sh['vocab'], hidden_size=sh['d_model'], intermediate_size=sh['d_ff'],
      num_hidden_layers=sh['layers'], num_attention_heads=sh['heads'],
      num_key_value_heads=sh['kv_heads'], max_position_embeddings=args.seq,
      rms_norm_eps=1e-5, tie_word_embeddings=False))
  if args.mode == 'lora':
    from peft import LoraConfig, get_peft_model
    model = get_peft_model(model, LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                                             target_modules=['q_proj', 'v_proj']))
  model.train()
  trainable = [p for p in model.parameters() if p.requires_grad]
  opt = torch.optim.AdamW(trainable, lr=LR, weight_decay=WEIGHT_DECAY)
  data = torch.from_numpy(tokens(args))
  inputs, targets = data[:, :-1], data[:, 1:]
  losses_seen = []

  def one() -> None:
    logits = model(input_ids=inputs).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses_seen.append(loss.item())

  for _ in range(args.warmup):
    one()
  start = time.perf_counter()
  for _ in range(args.steps):
    one()
  seconds = time.perf_counter() - start
  return {'ms_per_step': 1e3 * seconds / args.steps, 'peak_mb': peak_mb(),
          'after_imports_mb': imported, 'trained_params': sum(p.numel() for p in trainable),
          'params': sum(p.numel() for p in model.parameters()),
          'first_loss': losses_seen[0], 'last_loss': losses_seen[-1]}


def run_child(python: str, system: str, mode: str, threads: int,
              args: argparse.Namespace) -> dict[str, Any]:
  """One fresh child process's figures (its last stdout line); raises when it fails."""
  cmd = [python, __file__, f'--child={system}', f'--mode={mode}', f'--threads={threads}',
         f'--steps={args.steps}', f'--warmup={args.warmup}', f'--batch={args.batch}',
         f'--seq={args.seq}', *(['--quick'] if args.quick else [])]
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False,
                        env={**os.environ, 'PYTHONPATH': str(REPO)})
  if proc.returncode or not proc.stdout.strip():
    raise SystemExit(f'{system} {mode} at {threads} thread(s) failed: {proc.stderr[-2000:]}')
  return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(mode: str, threads: int, args: argparse.Namespace) -> dict[str, Any]:
  """Both systems' medians over interleaved repeats, the paired speedup and the memory ratio."""
  pythons = {'paxlike': args.pax_python, 'torch': args.peer_python}
  runs: dict[str, list[dict[str, Any]]] = {name: [] for name in pythons}
  for r in range(args.repeats):
    for name in (list(pythons) if r % 2 == 0 else list(pythons)[::-1]):
      runs[name].append(run_child(pythons[name], name, mode, threads, args))
      print(f'{mode} {threads}t repeat {r + 1} {name}: {runs[name][-1]["ms_per_step"]:.1f} ms, '
            f'{runs[name][-1]["peak_mb"]:.0f} MiB', file=sys.stderr, flush=True)
  out: dict[str, Any] = {}
  for name, values in runs.items():
    out[name] = {'ms_per_step': round(statistics.median(v['ms_per_step'] for v in values), 1),
                 'ms_per_step_all': [round(v['ms_per_step'], 1) for v in values],
                 'peak_mb': round(statistics.median(v['peak_mb'] for v in values)),
                 'after_imports_mb': round(statistics.median(
                     v['after_imports_mb'] for v in values)),
                 **{k: values[0][k] for k in ('params', 'trained_params', 'first_loss')}}
  out['speedup'] = round(statistics.median(
      t['ms_per_step'] / p['ms_per_step'] for p, t in zip(runs['paxlike'], runs['torch'])), 2)
  out['memory_ratio'] = round(out['paxlike']['peak_mb'] / out['torch']['peak_mb'], 2)
  return out


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  if args.child:
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.threads[0]])
    result = paxlike_child(args) if args.child == 'paxlike' else torch_child(args)
    print(json.dumps(result))
    return
  results = {f'{mode}_{threads}_threads': compare(mode, threads, args)
             for threads in args.threads for mode in args.modes}
  print(json.dumps({'benchmark': 'peers/peft_lora', 'model': args.shape, 'seq': args.seq,
                    'batch': args.batch, 'lora_rank': RANK, 'steps': args.steps,
                    'repeats': args.repeats, 'cpu_count': os.cpu_count(),
                    'load_avg_1m': round(os.getloadavg()[0], 2), **results}, indent=1))


if __name__ == '__main__':
  main()
