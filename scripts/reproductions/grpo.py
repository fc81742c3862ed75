"""grpo: GRPO raises the reward of an SFT model on a task with a verifiable answer (Shao et al.
2024, DeepSeekMath, section 4).

The task: two-digit additions ('37+58=' -> '95'), made locally (paxlike/data/arithmetic_synth.py),
with HELD_OUT problems drawn first and kept out of the training file. `lm.ArithmeticSft` trains
the 2-layer byte LM on the training file for `sft_steps`; `lm.GrpoTiny` then tunes LoRA
adapters on its checkpoint of step `sft_start` (short of converged, so there is room to climb)
with GRPO (G = 8 samples of each of 16 prompts a step, reward 1 for the exact
sum) for `grpo_steps`. The reward curve is the rows' `reward` (the mean over the samples of the
steps since the last row). Before and after, both models continue the held-out prompts through
`--mode=decode`: greedy (temperature 0) and sampled as GRPO samples (temperature 1, several
seeds), each scored by the same exact match: the SFT level the curve starts from, and where
GRPO leaves it on problems it never trained on.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Sequence

from reproductions import trainer
from reproductions.page import Report

NAME, TITLE = 'grpo', 'GRPO raises an SFT model\'s reward on a verifiable task'
FULL = dict(rows=20_000, held_out=256, sft_steps=300, sft_start=200, grpo_steps=200,
            log_every=10, seeds=(0, 1, 2, 3), tiny=False)
QUICK = dict(rows=600, held_out=32, sft_steps=10, sft_start=10, grpo_steps=4, log_every=2,
             seeds=(0,), tiny=True)
# The held-out sampled reward must rise by this much (absolute) to reproduce: the paper's gains
# were 5.3 (GSM8K) and 4.9 (MATH) points.
MIN_GAIN = 0.05
TAIL = 5         # The curve's end: the mean of its last this many rows.


def verdict(sft: float, grpo: float, curve_start: float, curve_end: float
            ) -> tuple[str, list[str]]:
  """(verdict, failed conditions) from the held-out sampled reward of the SFT and the GRPO
  model, and the training curve's first and last rows. Reproduced: the held-out reward rises
  by at least MIN_GAIN and the curve ends above where it starts. Not: the held-out reward
  does not rise. Else partly."""
  if not grpo > sft:
    return 'not', ['GRPO raises the held-out reward above the SFT model\'s']
  failed = []
  if grpo - sft < MIN_GAIN - 1e-9:  # (0.6 - 0.5 is 0.0999... in floats)
    failed.append(f'the held-out reward rises by at least {MIN_GAIN:g}')
  if not curve_end > curve_start:
    failed.append('the training reward ends above where it starts')
  return ('reproduced' if not failed else 'partly'), failed


def problems(plan: dict) -> tuple[list[dict], list[dict]]:
  """(training rows, held-out rows): the held-out problems drawn first (seed 1), the training
  rows (seed 0) without any of them."""
  from paxlike.data import arithmetic_synth
  held = arithmetic_synth.addition_rows(plan['held_out'], seed=1)
  prompts = {row['prompt'] for row in held}
  train = [r for r in arithmetic_synth.addition_rows(plan['rows']) if r['prompt'] not in prompts]
  return train, held


def continuations(out: str, prompts: Sequence[str]) -> list[str]:
  """Each prompt's continuation in `--mode=decode`'s output (each prompt followed by its
  continuation, blocks apart by a blank line), cut at the first newline (a byte LM's EOS)."""
  texts, at = [], 0
  for i, prompt in enumerate(prompts):
    start = out.index(prompt, at) + len(prompt)
    end = out.find('\n\n' + prompts[i + 1], start) if i + 1 < len(prompts) else len(out)
    texts.append(out[start:end].split('\n')[0])
    at = end
  return texts


def decoded(job: Path, prompts: Sequence[str], temperature: float, seed: int,
            work: Path) -> list[str]:
  """Each prompt's continuation by `--mode=decode` from `job` (4 new tokens), cut at EOS."""
  path = work / 'held_out_prompts.txt'
  path.write_text('\n'.join(prompts) + '\n')
  out = trainer.cli_output(
      [f'--job_log_dir={job}', '--mode=decode', f'--prompts_file={path}',
       f'--temperature={temperature}', f'--decode_seed={seed}', '--decode_length=4'],
      work / f'decoded_{job.name}_t{temperature:g}_s{seed}.txt')
  return continuations(out, prompts)


def accuracy(job: Path, held: list[dict], temperature: float, seeds: Sequence[int],
             work: Path) -> float:
  """The share of held-out continuations (over `seeds`) whose sum is exact."""
  right = total = 0
  for seed in seeds:
    texts = decoded(job, [r['prompt'] for r in held], temperature, seed, work)
    right += sum(t.strip() == r['answer'] for t, r in zip(texts, held))
    total += len(held)
  return right / total


def at_step(job: Path, step: int, out: Path) -> Path:
  """A copy of job dir `job` holding only its checkpoint of `step`, so that `--mode=decode`
  (which reads the latest) reads that one."""
  keep = lambda d, names: [n for n in names if Path(d).name == 'checkpoints' and n != str(step)]
  if not out.exists():
    shutil.copytree(job, out, ignore=keep)
  return out


def run(quick: bool, work: Path) -> Report:
  plan = QUICK if quick else FULL
  from paxlike.data import arithmetic_synth
  train_rows, held = problems(plan)
  files = arithmetic_synth.write_rows(work / 'sums.jsonl', train_rows)
  tiny = {'model.num_layers': 1} if plan['tiny'] else {}
  sft_rows = trainer.train('lm.ArithmeticSft', work / 'sft', {
      'data.files': files, 'train.num_steps': plan['sft_steps'], **tiny})
  grpo_rows = trainer.train('lm.GrpoTiny', work / 'grpo', {
      'data.files': files, 'train.init_from': f'job:{work / "sft"}@{plan["sft_start"]}', **tiny,
      'train.num_steps': plan['grpo_steps'], 'train.log_every': plan['log_every']})
  jobs = {'sft': at_step(work / 'sft', plan['sft_start'], work / 'sft_start'),
          'grpo': work / 'grpo'}
  levels = {}
  for name, job in jobs.items():
    trainer.log(f'decoding the held-out problems with {name}')
    levels[name] = {'greedy': accuracy(job, held, 0.0, (0,), work),
                    'sampled': accuracy(job, held, 1.0, plan['seeds'], work)}
  from reproductions import grpo_page
  return grpo_page.report(quick, plan, sft_rows, grpo_rows, levels, len(train_rows))
