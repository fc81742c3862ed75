"""A DPO train step against an SFT step on the same tokens, with LoRA and as a full fine-tune.

    python -m benchmarks.dpo_step [--steps 5] [--repeats 5] [--rank 8] [--quick]

A 2-layer d128 Llama-shaped TransformerLM (vocab 256, 4 heads, d_ff 512, seq 128) trained by
paxlike's centralized algorithm with AdamW on one batch of `P` = 8 preference pairs laid out as
the trainer gets them (2P rows: prompt + chosen, prompt + rejected; a 64-token prompt, 16 to 64
completion tokens, padding after). Six sides, timed in alternating repeats (≤ 2 steps in
flight, as the trainer runs) in this one process:

  sft_lora, sft_full     the LM loss on the same 2P rows' completion tokens (the same tokens
                         as DPO: the ratio is DPO's extra work, the reference's forward pass)
  sft_lora_chosen, ...   the LM loss on the P chosen rows alone (what TRL's comparison used)
  dpo_lora               DPO with LoRA: the reference is the base, the adapters off (one more
                         forward pass without them, no second copy of the weights)
  dpo_full               DPO as a full fine-tune: the reference is the frozen copy of the
                         params (paxlike/trainer/reference.py), no gradient, no optimizer state

Prints one JSON object: per side `ms_per_step` (median over repeats) and `targets` (scored
tokens per step); `ratios`: DPO over SFT on the same tokens and over SFT on the chosen rows,
each the median of per-repeat ratios (measured back to back); `goal` 2.2 (LoRA, same tokens).
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks import common

GOAL = 2.2  # DPO (LoRA, adapters-off reference) over SFT on the same tokens, at most.


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = common.parser(__doc__)
  parser.add_argument('--steps', type=int, default=5, help='steps per timed repeat')
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--rank', type=int, default=8)
  return parser.parse_args(argv)


def pair_batch(pairs: int, seq: int, prompt: int, seed: int = 0) -> dict:
  """A round batch [1, 1, 2 * pairs, seq] of pairs as PreferenceData lays them out: rows 2i and
  2i + 1 share `prompt` tokens, then each has its own completion; padding after (segment 0)."""
  import numpy as np
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, 256, (pairs, 2, seq + 1))
  tokens[:, 1, :prompt] = tokens[:, 0, :prompt]
  ends = rng.integers(prompt + 16, min(seq, prompt + 64) + 1, (pairs, 2))  # Exclusive.
  position = np.arange(seq)
  real = position < ends[..., None]
  mask = real & (position >= prompt - 1)  # Targets of the completion's tokens.
  flat = lambda x: x.reshape(1, 1, 2 * pairs, -1)
  return {'inputs': flat(tokens[..., :-1] * real), 'targets': flat(tokens[..., 1:] * real),
          'segment_ids': flat(real.astype(np.int32)),
          'positions': flat(np.broadcast_to(position, real.shape).astype(np.int32)),
          'mask': flat(mask.astype(np.float32))}


def chosen_rows(batch: dict) -> dict:
  """The batch's chosen rows alone (even rows)."""
  return {k: v[:, :, ::2] for k, v in batch.items()}


def side(model, loss_fn, trainable, params, batch: dict, steps: int):
  """(time `steps` steps -> seconds, scored targets per step, first loss) of one side."""
  import jax
  import jax.numpy as jnp
  import optax
  from paxlike.trainer.centralized import centralized
  alg = centralized(loss_fn, optax.adamw(1e-4), trainable=trainable)
  params = jax.tree.map(jnp.copy, params)  # Its own buffers: the step donates the state.
  state = {'s': alg.init(params)}
  step = jax.jit(alg.next, donate_argnums=0)
  batch = jax.tree.map(jnp.asarray, batch)
  weights, rng = jnp.ones(1), jax.random.key(0)

  def one():
    state['s'], metrics = step(state['s'], batch, weights, rng)
    return metrics['loss']

  first = float(one())  # Compiles.
  return (lambda: common.timed_loop(one, steps)), float(batch['mask'].sum()), first


def sides(shape: dict, rank: int, batch: dict, steps: int) -> dict:
  """The six sides (see the module docstring), each from the same initial params."""
  import flax.linen as nn
  import jax
  from paxlike.layers import TransformerLM
  from paxlike.layers.lora import lora_mask
  from paxlike.trainer import losses, preference, reference
  from paxlike.trainer.preference_loss import PreferenceLoss
  full = TransformerLM(**shape)
  lora = TransformerLM(**shape, lora_rank=rank, lora_targets=('query', 'value'))
  init = lambda m: nn.meta.unbox(m.init(jax.random.key(0), batch['inputs'][0, 0, :1])['params'])
  dpo = PreferenceLoss(kind='dpo', beta=0.1)
  full_params, lora_params = init(full), init(lora)
  chosen = chosen_rows(batch)
  return {
      'sft_lora': side(lora, losses.model_loss_fn(lora), lora_mask, lora_params, batch, steps),
      'dpo_lora': side(lora, preference.preference_loss_fn(lora, dpo), lora_mask, lora_params,
                       batch, steps),
      'sft_lora_chosen': side(lora, losses.model_loss_fn(lora), lora_mask, lora_params, chosen,
                              steps),
      'sft_full': side(full, losses.model_loss_fn(full), None, full_params, batch, steps),
      'dpo_full': side(full, preference.preference_loss_fn(full, dpo), reference.policy_mask,
                       reference.attach(full_params), batch, steps),
      'sft_full_chosen': side(full, losses.model_loss_fn(full), None, full_params, chosen, steps),
  }


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  steps, repeats = (2, 2) if args.quick else (args.steps, args.repeats)
  d, layers, seq, pairs, prompt = (32, 1, 48, 2, 16) if args.quick else (128, 2, 128, 8, 64)
  shape = dict(vocab_size=256, num_layers=layers, d_model=d, num_heads=4, d_ff=4 * d,
               max_len=seq, tied_embeddings=False)
  batch = pair_batch(pairs, seq, prompt)
  built = sides(shape, args.rank, batch, steps)
  times = common.alternate({name: s[0] for name, s in built.items()}, repeats)
  result = {'benchmark': 'dpo_step', 'model': {**shape, 'seq_len': seq},
            'pairs': pairs, 'lora_rank': args.rank, 'steps': steps, 'repeats': repeats,
            'goal': GOAL}
  for name, (_, targets, first) in built.items():
    result[name] = {'ms_per_step': 1e3 * statistics.median(times[name]) / steps,
                    'targets': targets, 'first_loss': first,
                    'spread': common.spread(times[name])}
  result['ratios'] = {
      f'{kind}_{base}': common.paired_ratio(times[f'dpo_{kind}'], times[f'sft_{kind}{suffix}'])
      for kind in ('lora', 'full') for base, suffix in (('same_tokens', ''),
                                                         ('chosen_rows', '_chosen'))}
  result['meets_goal'] = result['ratios']['lora_same_tokens'] <= GOAL
  common.emit(result)


if __name__ == '__main__':
  main()
