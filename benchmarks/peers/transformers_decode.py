"""paxlike's `--mode=decode` against transformers' `generate`, whole processes, same checkpoint.

  python benchmarks/peers/transformers_decode.py [--peer_python=.venv-peers/bin/python]

Trains a 1-step Llama job (the issue's 4 layers, d 256, 4 / 2 heads, SwiGLU 704; byte vocab
256, RMSNorm, rope, untied), exports it with `python -m paxlike.interop.hf`, then times, in
interleaved repeats, whole runs that greedily decode 32 and 256 new tokens after the same
prompt: paxlike's CLI with its persistent compilation cache off (cold) and warm, and a Python
process of the peers' environment (`make peers`) that loads the exported directory with
transformers and calls `generate`. The per-token rate is (256 - 32) over the difference of the
two lengths' median whole-run times.
It then times the decode alone, with start-up out of it (`in_process`): one process per
system loads the exported directory (paxlike through `paxlike.interop`), generates each length
once untimed (paxlike compiles there), then `--repeats` timed times; the per-token rate is
(256 - 32) over the difference of the median generate times.
`--device cuda` runs transformers on the GPU (paxlike runs on jax's default backend, the GPU
where there is one); `--pax_python` is the interpreter of paxlike's runs.
Prints one JSON object: both systems' figures, the ratios, and whether the tokens agree.
This script never imports torch or transformers; only the child process does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PROMPT = 'def '
PROMPT_IDS = json.dumps(list(PROMPT.encode()))
MODEL = ['--fdl_set=model.num_layers=4', '--fdl_set=model.d_model=256',
         '--fdl_set=model.num_heads=4', '--fdl_set=model.num_kv_heads=2',
         '--fdl_set=model.d_ff=704', '--fdl_set=model.max_len=512',
         '--fdl_set=model.use_rmsnorm=True', '--fdl_set=model.gated_mlp=True',
         '--fdl_set=model.rope=True', '--fdl_set=model.tied_embeddings=False',
         '--fdl_set=model.norm_eps=1e-5']
PEER = '''
import json, sys, time
import torch
from transformers import AutoModelForCausalLM
hf, ids, lengths, device, repeats = sys.argv[1:]
model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).to(device).eval()
ids = torch.tensor([json.loads(ids)], device=device)

def generate(n):
  with torch.no_grad():
    out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                         attention_mask=torch.ones_like(ids), pad_token_id=0)
  return out[0, ids.shape[1]:].tolist()

def timed(n):
  if device != 'cpu':
    torch.cuda.synchronize()
  start = time.perf_counter()
  generate(n)
  if device != 'cpu':
    torch.cuda.synchronize()
  return time.perf_counter() - start

tokens = {n: generate(n) for n in map(int, lengths.split(','))}
seconds = {n: [timed(n) for _ in range(int(repeats))] for n in tokens}
print(json.dumps({'tokens': tokens, 'generate_s': seconds}))
'''
PAX = '''
import json, sys, time
import fiddle as fdl
import numpy as np
from paxlike.decode import cache_len_for, generate
from paxlike.interop.checkpoint import load_hf_checkpoint
hf, ids, lengths, device, repeats = sys.argv[1:]
config, params = load_hf_checkpoint(hf)
model, prompt = fdl.build(config), np.asarray(json.loads(ids), np.int32)

def timed(n):
  start = time.perf_counter()
  out = generate(model, params, [prompt], max_new_tokens=n,
                 cache_len=cache_len_for(model, len(prompt), n))
  return time.perf_counter() - start, out[0].tolist()

tokens = {n: timed(n)[1] for n in map(int, lengths.split(','))}
seconds = {n: [timed(n)[0] for _ in range(int(repeats))] for n in tokens}
print(json.dumps({'tokens': tokens, 'generate_s': seconds}))
'''


def timed(cmd: list[str]) -> tuple[float, str]:
  """(wall seconds of the whole process, its stdout); raises when it fails."""
  start = time.perf_counter()
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
  if proc.returncode:
    raise SystemExit(f'{" ".join(cmd[:4])} ... failed: {proc.stderr[-2000:]}')
  return time.perf_counter() - start, proc.stdout


def prepare(work: Path, pax_python: str) -> tuple[Path, Path]:
  """(job dir, HF dir) of the tiny Llama, trained and exported once."""
  job, hf = work / 'job', work / 'hf'
  if not (job / 'checkpoints').is_dir():
    timed([pax_python, '-m', 'paxlike.main', '--exp=lm.StdlibTiny', *MODEL,
           '--fdl_set=data.seq_len=64', '--fdl_set=train.num_steps=1',
           '--fdl_set=train.checkpoint_every=1', f'--job_log_dir={job}'])
  if not (hf / 'config.json').is_file():
    timed([pax_python, '-m', 'paxlike.interop.hf', f'--job_log_dir={job}', f'--out={hf}'])
  return job, hf


def commands(args: argparse.Namespace, job: Path, hf: Path, length: int
             ) -> dict[str, list[str]]:
  """Each system's whole-run command decoding `length` tokens greedily after PROMPT."""
  pax = [args.pax_python, '-m', 'paxlike.main', f'--job_log_dir={job}', '--mode=decode',
         f'--decode_length={length}', '--temperature=0', f'--prompt={PROMPT}']
  return {'paxlike_cold': pax + ['--compilation_cache_dir='],
          'paxlike_warm': pax + [f'--compilation_cache_dir={args.work / "jax_cache"}'],
          'transformers': [args.peer_python, '-c', PEER, str(hf), PROMPT_IDS, str(length),
                           args.device, '0']}


def rate(times: dict[int, list[float]], short: int, long: int) -> float | None:
  """New tokens per second from the difference of the median times of the two lengths; None
  when the longer was not slower (the tokens' time lost in the spread)."""
  extra = statistics.median(times[long]) - statistics.median(times[short])
  return round((long - short) / extra, 1) if extra > 0 else None


def ratio(ours: float | None, theirs: float | None) -> float | None:
  return round(ours / theirs, 2) if ours and theirs else None


def whole_runs(args: argparse.Namespace, job: Path, hf: Path) -> dict[str, Any]:
  """Interleaved whole runs of each system at both lengths: median times, rates, ratios."""
  short, long = args.lengths
  runs = {length: commands(args, job, hf, length) for length in (short, long)}
  for length in (short, long):  # Fills the warm cache; checks the tokens agree.
    _, pax_text = timed(runs[length]['paxlike_warm'])
    _, peer_out = timed(runs[length]['transformers'])
  times = {name: {short: [], long: []} for name in runs[short]}
  for _ in range(args.repeats):
    for length in (short, long):
      for name, cmd in runs[length].items():
        times[name][length].append(timed(cmd)[0])
  from paxlike.tokenizers import load_tokenizer  # pylint: disable=import-outside-toplevel
  peer_ids = json.loads(peer_out)['tokens'][str(long)]
  same = pax_text.rstrip('\n') == PROMPT + load_tokenizer('bytes').decode(peer_ids)
  figures = {name: {'median_whole_run_s': {str(n): round(statistics.median(t[n]), 3) for n in t},
                    'tokens_per_s': rate(t, short, long)}
             for name, t in times.items()}
  peer = figures['transformers']
  return {'same_greedy_tokens': same, **figures,
          'ratio_tokens_per_s': {k: ratio(figures[k]['tokens_per_s'], peer['tokens_per_s'])
                                 for k in ('paxlike_cold', 'paxlike_warm')},
          'ratio_whole_run_long': {k: round(figures[k]['median_whole_run_s'][str(long)]
                                            / peer['median_whole_run_s'][str(long)], 2)
                                   for k in ('paxlike_cold', 'paxlike_warm')}}


def in_process(args: argparse.Namespace, hf: Path) -> dict[str, Any]:
  """Each system's generate calls timed inside one process after an untimed call per length:
  median seconds per length, the per-token rate from their difference, the ratio."""
  lengths = ','.join(map(str, args.lengths))
  out = {name: json.loads(timed([python, '-c', code, str(hf), PROMPT_IDS, lengths, args.device,
                                 str(args.repeats)])[1])
         for name, python, code in (('paxlike', args.pax_python, PAX),
                                    ('transformers', args.peer_python, PEER))}
  figures = {name: {'median_generate_s': {n: round(statistics.median(t), 4)
                                          for n, t in o['generate_s'].items()},
                    'tokens_per_s': rate({int(n): t for n, t in o['generate_s'].items()},
                                         *args.lengths)}
             for name, o in out.items()}
  long = str(args.lengths[1])
  return {'same_greedy_tokens': out['paxlike']['tokens'][long]
                                == out['transformers']['tokens'][long],
          **figures, 'ratio_tokens_per_s': ratio(figures['paxlike']['tokens_per_s'],
                                                 figures['transformers']['tokens_per_s'])}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--peer_python', default=str(REPO / '.venv-peers/bin/python'))
  parser.add_argument('--pax_python', default=sys.executable)
  parser.add_argument('--device', default='cpu', help="transformers' torch device (cpu, cuda)")
  parser.add_argument('--work', default='/tmp/paxlike_peers_decode', type=Path)
  parser.add_argument('--repeats', default=3, type=int)
  parser.add_argument('--lengths', default=[32, 256], type=int, nargs=2)
  parser.add_argument('--parts', default=['whole_runs', 'in_process'], nargs='+',
                      choices=['whole_runs', 'in_process'])
  args = parser.parse_args()
  job, hf = prepare(args.work, args.pax_python)
  result: dict[str, Any] = {'lengths': args.lengths, 'repeats': args.repeats,
                            'device': args.device}
  if 'whole_runs' in args.parts:
    result.update(whole_runs(args, job, hf))
  if 'in_process' in args.parts:
    result['in_process'] = in_process(args, hf)
  print(json.dumps(result, indent=1))


if __name__ == '__main__':
  main()
