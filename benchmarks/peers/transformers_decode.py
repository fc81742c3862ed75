"""paxlike's `--mode=decode` against transformers' `generate`, whole processes, same checkpoint.

  python benchmarks/peers/transformers_decode.py [--peer_python=.venv-peers/bin/python]

Trains a 1-step Llama job (the issue's 4 layers, d 256, 4 / 2 heads, SwiGLU 704; byte vocab
256, RMSNorm, rope, untied), exports it with `python -m paxlike.interop.hf`, then times, in
interleaved repeats, whole runs that greedily decode 32 and 256 new tokens after the same
prompt: paxlike's CLI with its persistent compilation cache off (cold) and warm, and a Python
process of the peers' environment (`make peers`) that loads the exported directory with
transformers and calls `generate`. The per-token rate is (256 - 32) over the difference of the
two lengths' median whole-run times.
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

REPO = Path(__file__).resolve().parents[2]
PROMPT = 'def '
MODEL = ['--fdl_set=model.num_layers=4', '--fdl_set=model.d_model=256',
         '--fdl_set=model.num_heads=4', '--fdl_set=model.num_kv_heads=2',
         '--fdl_set=model.d_ff=704', '--fdl_set=model.max_len=512',
         '--fdl_set=model.use_rmsnorm=True', '--fdl_set=model.gated_mlp=True',
         '--fdl_set=model.rope=True', '--fdl_set=model.tied_embeddings=False',
         '--fdl_set=model.norm_eps=1e-5']
PEER = '''
import json, sys
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32).eval()
ids = torch.tensor([json.loads(sys.argv[2])])
n = int(sys.argv[3])
with torch.no_grad():
  out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                       attention_mask=torch.ones_like(ids), pad_token_id=0)
print(json.dumps(out[0, ids.shape[1]:].tolist()))
'''


def timed(cmd: list[str]) -> tuple[float, str]:
  """(wall seconds of the whole process, its stdout); raises when it fails."""
  start = time.perf_counter()
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
  if proc.returncode:
    raise SystemExit(f'{" ".join(cmd[:4])} ... failed: {proc.stderr[-2000:]}')
  return time.perf_counter() - start, proc.stdout


def prepare(work: Path) -> tuple[Path, Path]:
  """(job dir, HF dir) of the tiny Llama, trained and exported once."""
  job, hf = work / 'job', work / 'hf'
  if not (job / 'checkpoints').is_dir():
    timed([sys.executable, '-m', 'paxlike.main', '--exp=lm.StdlibTiny', *MODEL,
           '--fdl_set=data.seq_len=64', '--fdl_set=train.num_steps=1',
           '--fdl_set=train.checkpoint_every=1', f'--job_log_dir={job}'])
  if not (hf / 'config.json').is_file():
    timed([sys.executable, '-m', 'paxlike.interop.hf', f'--job_log_dir={job}', f'--out={hf}'])
  return job, hf


def commands(job: Path, hf: Path, peer_python: str, cache: Path, length: int
             ) -> dict[str, list[str]]:
  """Each system's whole-run command decoding `length` tokens greedily after PROMPT."""
  pax = [sys.executable, '-m', 'paxlike.main', f'--job_log_dir={job}', '--mode=decode',
         f'--decode_length={length}', '--temperature=0', f'--prompt={PROMPT}']
  ids = json.dumps(list(PROMPT.encode()))
  return {'paxlike_cold': pax + ['--compilation_cache_dir='],
          'paxlike_warm': pax + [f'--compilation_cache_dir={cache}'],
          'transformers': [peer_python, '-c', PEER, str(hf), ids, str(length)]}


def rate(times: dict[int, list[float]], short: int, long: int) -> float | None:
  """New tokens per second from the difference of the median whole runs; None when the longer
  run was not slower (the tokens' time lost in the runs' spread)."""
  extra = statistics.median(times[long]) - statistics.median(times[short])
  return round((long - short) / extra, 1) if extra > 0 else None


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--peer_python', default=str(REPO / '.venv-peers/bin/python'))
  parser.add_argument('--work', default='/tmp/paxlike_peers_decode', type=Path)
  parser.add_argument('--repeats', default=3, type=int)
  parser.add_argument('--lengths', default=[32, 256], type=int, nargs=2)
  args = parser.parse_args()
  job, hf = prepare(args.work)
  short, long = args.lengths
  runs = {length: commands(job, hf, args.peer_python, args.work / 'jax_cache', length)
          for length in (short, long)}
  for length in (short, long):  # Fills the warm cache; checks the tokens agree.
    _, pax_text = timed(runs[length]['paxlike_warm'])
    _, peer_ids = timed(runs[length]['transformers'])
  times = {name: {short: [], long: []} for name in runs[short]}
  for _ in range(args.repeats):
    for length in (short, long):
      for name, cmd in runs[length].items():
        times[name][length].append(timed(cmd)[0])
  from paxlike.tokenizers import load_tokenizer  # pylint: disable=import-outside-toplevel
  same = pax_text.rstrip('\n') == PROMPT + load_tokenizer('bytes').decode(json.loads(peer_ids))
  figures = {name: {'median_whole_run_s': {str(n): round(statistics.median(t[n]), 3) for n in t},
                    'tokens_per_s': rate(t, short, long)}
             for name, t in times.items()}
  peer = figures['transformers']
  print(json.dumps({
      'lengths': [short, long], 'repeats': args.repeats, 'same_greedy_tokens': same,
      **figures,
      'ratio_tokens_per_s': {k: round(figures[k]['tokens_per_s'] / peer['tokens_per_s'], 2)
                             if figures[k]['tokens_per_s'] and peer['tokens_per_s'] else None
                             for k in ('paxlike_cold', 'paxlike_warm')},
      'ratio_whole_run_long': {k: round(figures[k]['median_whole_run_s'][str(long)]
                                        / peer['median_whole_run_s'][str(long)], 2)
                               for k in ('paxlike_cold', 'paxlike_warm')}}, indent=1))


if __name__ == '__main__':
  main()
