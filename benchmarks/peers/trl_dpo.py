"""TRL's DPOTrainer step against its SFTTrainer step on the same tokens, beside paxlike's.

  python benchmarks/peers/trl_dpo.py [--peer_python=.venv-peers/bin/python] [--threads 1]
      [--steps 5] [--repeats 3] [--paxlike_json=FILE]

The peer's side runs in the peers' environment (`make peers`: torch, transformers, peft, trl)
as a child process: a 2-layer Llama (hidden 128, 4 heads, SwiGLU 512, vocab 256, untied; the
shapes of benchmarks/dpo_step.py) trained by TRL 1.x on 8 pairs a step of a character-level
preference set (a 63-character prompt, 15 to 63 characters of completion, + EOS: the token
counts of dpo_step.py's batch), float32, `--threads` torch threads. Four sides in alternating
repeats, each a fresh trainer from the same initial weights, timed per optimizer step
(callbacks around each step; a call's first step is left out): `sft_lora` / `sft_full`
(SFTTrainer on the 16 prompt + completion rows, completion-only loss: the tokens DPO scores)
and `dpo_lora` / `dpo_full` (DPOTrainer, beta 0.1; LoRA rank 8 on q_proj and v_proj, its
reference the adapters off; full: a second copy of the model as the reference). Prints one
JSON object: per side the median ms per step, TRL's DPO / SFT ratios, and, when
`--paxlike_json` names the output of benchmarks/dpo_step.py (same shapes, measured apart),
paxlike's ratios and ms beside them. This script imports no torch, transformers or trl.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PEER = r'''
import copy, json, random, statistics, sys, time
args = json.loads(sys.argv[1])
import torch
torch.set_num_threads(args['threads'])
torch.manual_seed(0)
from datasets import Dataset
from peft import LoraConfig
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, TrainerCallback
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

chars = [chr(i) for i in range(33, 127)]
vocab = {c: i for i, c in enumerate(chars)}
for special in ('<pad>', '<eos>', '<unk>'):
  vocab[special] = len(vocab)
tok = Tokenizer(models.WordLevel(vocab, unk_token='<unk>'))
tok.pre_tokenizer = pre_tokenizers.Split(Regex('.'), behavior='isolated')
tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token='<pad>', eos_token='<eos>',
                                    unk_token='<unk>')
rng = random.Random(0)
text = lambda n: ''.join(rng.choice(chars) for _ in range(n))
pairs = args['pairs'] * (args['steps'] + 1)
rows = [{'prompt': text(63), 'chosen': text(rng.randint(15, 63)),
         'rejected': text(rng.randint(15, 63))} for _ in range(pairs)]
sft_rows = [{'prompt': r['prompt'], 'completion': r[k] + '<eos>'} for r in rows
            for k in ('chosen', 'rejected')]
config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                     tie_word_embeddings=False, pad_token_id=vocab['<pad>'],
                     eos_token_id=vocab['<eos>'])
init = LlamaForCausalLM(config).state_dict()


class Times(TrainerCallback):
  def __init__(self):
    self.seconds, self.start = [], None
  def on_step_begin(self, args, state, control, **kwargs):
    self.start = time.perf_counter()
  def on_step_end(self, args, state, control, **kwargs):
    self.seconds.append(time.perf_counter() - self.start)


def model():
  m = LlamaForCausalLM(config)
  m.load_state_dict(init)
  return m


def run(name, out):
  lora = LoraConfig(r=8, lora_alpha=16, target_modules=['q_proj', 'v_proj'],
                    task_type='CAUSAL_LM') if name.endswith('lora') else None
  common = dict(output_dir=out, max_steps=args['steps'] + 1, learning_rate=1e-4, bf16=False,
                use_cpu=True, report_to=[], save_strategy='no', logging_steps=1000,
                disable_tqdm=True, dataloader_num_workers=0, seed=0)
  times = Times()
  if name.startswith('dpo'):
    cfg = DPOConfig(per_device_train_batch_size=args['pairs'], beta=0.1, max_length=None,
                    **common)
    policy = model()
    ref = None if lora else copy.deepcopy(policy).eval()
    trainer = DPOTrainer(model=policy, ref_model=ref, args=cfg, train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer, peft_config=lora, callbacks=[times])
  else:
    cfg = SFTConfig(per_device_train_batch_size=2 * args['pairs'], max_length=None,
                    completion_only_loss=True, **common)
    trainer = SFTTrainer(model=model(), args=cfg, train_dataset=Dataset.from_list(sft_rows),
                         processing_class=tokenizer, peft_config=lora, callbacks=[times])
  trainer.train()
  return times.seconds[1:]


names = ['sft_lora', 'dpo_lora', 'sft_full', 'dpo_full']
values = {n: [] for n in names}
for r in range(args['repeats']):
  for name in (names if r % 2 == 0 else names[::-1]):
    values[name].append(statistics.median(run(name, args['out'])))
    print(f'repeat {r + 1} {name}: {values[name][-1]:.4f} s/step', file=sys.stderr, flush=True)
print(json.dumps({'per_repeat_seconds': values, 'torch_version': torch.__version__,
                  'trl_version': __import__('trl').__version__, 'threads': args['threads']}))
'''


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--peer_python', default=str(REPO / '.venv-peers' / 'bin' / 'python'))
  parser.add_argument('--threads', type=int, default=1)
  parser.add_argument('--steps', type=int, default=5, help='timed steps per trainer call')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--pairs', type=int, default=8)
  parser.add_argument('--paxlike_json', type=Path, help="benchmarks/dpo_step.py's output")
  parser.add_argument('--work', type=Path, default=Path('/tmp/paxlike-trl-dpo'))
  return parser.parse_args(argv)


def ratio(values: dict[str, list[float]], numerator: str, denominator: str) -> float:
  """Median over repeats of numerator / denominator (measured back to back)."""
  pairs = sorted(a / b for a, b in zip(values[numerator], values[denominator]))
  middle = len(pairs) // 2
  return pairs[middle] if len(pairs) % 2 else (pairs[middle - 1] + pairs[middle]) / 2


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  spec = {'threads': args.threads, 'steps': args.steps, 'repeats': args.repeats,
          'pairs': args.pairs, 'out': str(args.work)}
  proc = subprocess.run([args.peer_python, '-c', PEER, json.dumps(spec)], cwd=REPO, text=True,
                        stdout=subprocess.PIPE, check=False)
  if proc.returncode:
    raise SystemExit(f'the TRL child failed (exit {proc.returncode}); see its stderr above')
  peer = json.loads(proc.stdout.strip().splitlines()[-1])
  values = peer.pop('per_repeat_seconds')
  result = {'benchmark': 'trl_dpo', **peer, 'steps': args.steps, 'repeats': args.repeats,
            'pairs': args.pairs,
            'trl': {**{f'{k}_ms_per_step': 1e3 * sorted(v)[len(v) // 2] for k, v in values.items()},
                    'dpo_over_sft_lora': ratio(values, 'dpo_lora', 'sft_lora'),
                    'dpo_over_sft_full': ratio(values, 'dpo_full', 'sft_full')}}
  if args.paxlike_json:
    pax = json.loads(args.paxlike_json.read_text())
    result['paxlike'] = {'dpo_over_sft_lora': pax['ratios']['lora_same_tokens'],
                         'dpo_over_sft_full': pax['ratios']['full_same_tokens'],
                         **{f'{k}_ms_per_step': pax[k]['ms_per_step']
                            for k in ('sft_lora', 'dpo_lora', 'sft_full', 'dpo_full')}}
  print(json.dumps(result), flush=True)


if __name__ == '__main__':
  main()
