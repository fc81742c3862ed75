"""A GRPO step's time split into sampling and training, beside the decoder alone.

    python -m benchmarks.grpo_step [--prompts 16] [--generations 8] [--new_tokens 32]
                                   [--steps 5] [--quick]

The task is `lm.GrpoTiny` (the 2-layer byte LM with LoRA rank 8, exact-match reward on short
additions) from its random init, so completions run to `--new_tokens` rather than stopping
after a few digits. Each step's parts, timed in the trainer's own order (GrpoStep): `sample`
(the decoder: one jitted prefill and while_loop on the mesh, tokens back on the host),
`host` (completion texts, rewards, the training batch placed on the mesh), `score` (the
advantages and the reference's log-probabilities, jitted) and `update` (the compiled train
step). Beside it, `paxlike.decode.generate` alone on the same prompts and params, interleaved
with the steps: `sampling_vs_decoder` is the step's sampling tokens/s over the decoder's (the
GRPO step adds nothing to sampling when it is ~1). Medians over the steps after the first
(compiling) one. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks import common


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = common.parser(__doc__, 'tiny and 2 steps (tests)')
  parser.add_argument('--prompts', type=int, default=16)
  parser.add_argument('--generations', type=int, default=8)
  parser.add_argument('--new_tokens', type=int, default=32)
  parser.add_argument('--steps', type=int, default=5)
  args = parser.parse_args(argv)
  if args.quick:
    args.prompts, args.generations, args.new_tokens, args.steps = 2, 2, 4, 2
  return args


def grpo_trainer(args: argparse.Namespace, root: Path):
  """lm.GrpoTiny's trainer on additions written to `root`, and a fresh state."""
  import jax
  from paxlike.cli import run_config
  from paxlike.config import config_io
  from paxlike.data import arithmetic_synth
  from paxlike.trainer import build
  path = arithmetic_synth.write_rows(root / 'sums.jsonl', arithmetic_synth.addition_rows(400))
  overrides = [f'data.files={path}', f'data.batch_size={args.prompts}',
               f'loss.num_generations={args.generations}',
               f'loss.max_completion_length={args.new_tokens}', 'data.num_eval_batches=1']
  task = config_io.build(run_config.run_config(None, 'lm.GrpoTiny', overrides=overrides))
  trainer = build.setup(task, evaluator=False)
  with jax.set_mesh(trainer.program.mesh):
    state = trainer.program.init(jax.random.key(0))
  return trainer, state


def timed_step(trainer, state, step: int) -> tuple[object, dict[str, float], int]:
  """One GRPO step as GrpoStep.__call__ runs it, each part timed: (state, seconds per part,
  new tokens sampled)."""
  import jax
  from paxlike.trainer import loop
  fn = trainer.step
  batches, weights, rng = loop.round_inputs(trainer, step)
  params, times, start = state.alg.params, {}, time.perf_counter()
  prompts, rows = fn.prompts(batches)
  completions = fn.sample(params, prompts, rng)
  times['sample'], start = time.perf_counter() - start, time.perf_counter()
  placed, _ = fn.training_batch(prompts, rows, completions)
  jax.block_until_ready(placed)
  times['host'], start = time.perf_counter() - start, time.perf_counter()
  scored = jax.block_until_ready(fn.score(params, placed))
  times['score'], start = time.perf_counter() - start, time.perf_counter()
  state, metrics = fn.update(state, scored, weights, rng)
  jax.block_until_ready(metrics)
  times['update'] = time.perf_counter() - start
  return state, times, sum(len(c) for c in completions)


def decoder_seconds(trainer, state, step: int) -> tuple[float, int]:
  """`paxlike.decode.generate` alone on step `step`'s prompts (G each), the same params and
  options, another seed: (seconds, new tokens)."""
  from paxlike.decode import engine
  from paxlike.trainer import loop
  task, program = trainer.task, trainer.step.program
  prompts, _ = trainer.step.prompts(loop.round_inputs(trainer, step)[0])
  repeated = [p for p in prompts for _ in range(task.loss.num_generations)]
  new = task.loss.max_completion_length
  cache_len = engine.cache_len_for(task.model, max(map(len, repeated)), new)
  start = time.perf_counter()
  out = engine.generate(task.model, state.alg.params, repeated, max_new_tokens=new,
                        temperature=task.loss.temperature, eos_id=task.data.stop_id(),
                        seed=step, cache_len=cache_len,
                        mesh=program.mesh, rules=program.rules)
  return time.perf_counter() - start, sum(len(c) for c in out)


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  import jax
  with tempfile.TemporaryDirectory() as tmp:
    trainer, state = grpo_trainer(args, Path(tmp))
    parts, decoder, tokens = [], [], []
    with jax.set_mesh(trainer.program.mesh):
      for step in range(1, args.steps + 1):
        state, times, n = timed_step(trainer, state, step)
        seconds, m = decoder_seconds(trainer, state, step)
        if step > 1:  # The first compiles.
          parts.append(times)
          tokens.append(n)
          decoder.append(m / seconds)
  med = {k: common.median([p[k] for p in parts]) for k in parts[0]}
  total = sum(med.values())
  sampling_rate = common.median([n / p['sample'] for n, p in zip(tokens, parts)])
  common.emit({
      'benchmark': 'grpo_step', **common.machine(), 'prompts': args.prompts,
      'generations': args.generations, 'new_tokens': args.new_tokens,
      'steps_timed': len(parts), 'step_ms': 1000 * total,
      **{f'{k}_ms': 1000 * v for k, v in med.items()},
      **{f'{k}_share': v / total for k, v in med.items()},
      'sampling_tokens_per_sec': sampling_rate,
      'decoder_tokens_per_sec': common.median(decoder),
      'sampling_vs_decoder': sampling_rate / common.median(decoder)})


if __name__ == '__main__':
  main()
