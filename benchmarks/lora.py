"""LoRA against full fine-tuning: train-step time and optimizer-state bytes.

    python -m benchmarks.lora [--steps 20] [--repeats 3] [--rank 8] [--quick]

A 4-layer d256 Llama-shaped TransformerLM (vocab 256, 4 heads, d_ff 1024, seq 128, batch 8),
trained by paxlike's centralized algorithm with AdamW: `full` trains every param, `lora` gives
the model rank-`--rank` adapters on the query and value kernels (`model.lora_rank`) and trains
only those (`centralized(..., trainable=lora_mask)`: no base gradients, no base optimizer
state). Timed in alternating repeats with at most 2 steps in flight, as the trainer runs.
Prints one JSON object: per side `ms_per_step` (median), `opt_state_bytes`, `trained_params`;
`speedup` (full / lora step time) and `opt_state_ratio` (lora / full bytes).

`--preset 1b` (or 350m) times paxlike/configs/models.py's preset instead, at `--batch` × `--seq`
(default 4 × 2048), on whatever accelerator there is; `--sides lora` leaves out the full fine-tune (the
1B model's full AdamW state does not fit one TPU v5e chip). Each side then also reports
`steps_per_sec` and `mfu`: the model's training FLOPs (6·N + attention per token, as the MFU
benchmarks count them; a LoRA step skips the base weights' gradients, about a third of that)
over the chip's bf16 peak (null where unknown).
"""

from __future__ import annotations

import argparse
import math
import statistics

from benchmarks import common


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = common.parser(__doc__)
  parser.add_argument('--steps', type=int, default=20, help='steps per timed repeat')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--rank', type=int, default=8)
  parser.add_argument('--preset', choices=('350m', '1b'), help='a paxlike/configs/models.py size')
  parser.add_argument('--batch', type=int, default=4, help='with --preset')
  parser.add_argument('--seq', type=int, default=2048, help='with --preset')
  parser.add_argument('--sides', default='full,lora')
  return parser.parse_args(argv)


def preset_shape(args: argparse.Namespace):
  """(base model, its description, seq, batch) of --preset (shrunk with --quick)."""
  import fiddle as fdl
  from paxlike.configs import models as model_configs
  model = fdl.build(getattr(model_configs, f'lm_{args.preset}')())
  seq, batch = args.seq, args.batch
  if args.quick:
    model = model.clone(num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, d_ff=128,
                        vocab_size=256)
    seq, batch = 32, 2
  shape = {'preset': args.preset, 'num_layers': model.num_layers, 'd_model': model.d_model,
           'vocab_size': model.vocab_size}
  return model, shape, seq, batch


def nbytes(tree) -> int:
  import jax
  import numpy as np
  return sum(math.prod(np.shape(x)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def side(model, trainable, batch, steps: int):
  """(time `steps` steps -> seconds, opt_state bytes, trained param count) for one side."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import optax
  from paxlike.trainer import losses
  from paxlike.core.trainable import split_params
  from paxlike.trainer.centralized import centralized
  params = nn.meta.unbox(model.init(jax.random.key(0), batch['inputs'][0, 0, :1])['params'])
  alg = centralized(losses.model_loss_fn(model), optax.adamw(1e-3), trainable=trainable)
  state = {'s': alg.init(params)}
  step = jax.jit(alg.next, donate_argnums=0)
  weights, rng = jnp.ones(1), jax.random.key(0)

  def one():
    state['s'], metrics = step(state['s'], batch, weights, rng)
    return metrics['loss']

  jax.block_until_ready(one())  # Compile.
  trained = split_params(params, trainable)[0]
  return ((lambda: common.timed_loop(one, steps)), nbytes(state['s'].opt_state),
          sum(math.prod(x.shape) for x in jax.tree.leaves(trained)))


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  import jax
  import jax.numpy as jnp
  import numpy as np
  from paxlike.layers import TransformerLM
  from paxlike.layers.lora import lora_mask
  steps, repeats = (3, 2) if args.quick else (args.steps, args.repeats)
  if args.preset:
    base, shape, seq, batch = preset_shape(args)
    models = {'full': base, 'lora': base.clone(lora_rank=args.rank)}
  else:
    d, layers, seq, batch = (64, 2, 32, 2) if args.quick else (256, 4, 128, 8)
    shape = dict(vocab_size=256, num_layers=layers, d_model=d, num_heads=4, d_ff=4 * d,
                 max_len=seq, tied_embeddings=False)
    models = {'full': TransformerLM(**shape), 'lora': TransformerLM(**shape, lora_rank=args.rank)}
  tokens = np.random.default_rng(0).integers(0, min(256, models['full'].vocab_size),
                                              (1, 1, batch, seq + 1))
  data = {'inputs': jnp.asarray(tokens[..., :-1]), 'targets': jnp.asarray(tokens[..., 1:]),
          'mask': jnp.ones((1, 1, batch, seq), jnp.float32)}
  names = args.sides.split(',')
  sides = {name: side(models[name], lora_mask if name == 'lora' else None, data, steps)
           for name in names}
  times = common.alternate({name: s[0] for name, s in sides.items()}, repeats)
  result = {'model': {**shape, 'seq_len': seq, 'batch': batch}, 'lora_rank': args.rank,
            'steps': steps, 'repeats': repeats, 'device_kind': jax.devices()[0].device_kind}
  for name, (_, opt_bytes, trained) in sides.items():
    result[name] = {'ms_per_step': 1e3 * statistics.median(times[name]) / steps,
                    'opt_state_bytes': opt_bytes, 'trained_params': trained}
    if args.preset:
      result[name].update(rates(models[name], seq, batch, result[name]['ms_per_step']))
  if len(sides) == 2:
    result['speedup'] = result['full']['ms_per_step'] / result['lora']['ms_per_step']
    result['opt_state_ratio'] = (result['lora']['opt_state_bytes']
                                 / result['full']['opt_state_bytes'])
  common.emit(result)


def rates(model, seq: int, batch: int, ms_per_step: float) -> dict:
  """steps/s, tokens/s and MFU (6·N + attention FLOPs per token over the chip's peak)."""
  import jax
  from paxlike.families import lm_flops
  from paxlike.trainer import throughput
  steps_per_sec = 1e3 / ms_per_step
  peak = throughput.peak_flops_per_sec(jax.devices()[0].device_kind)
  flops = lm_flops.flops_per_token(model, seq) * seq * batch
  return {'steps_per_sec': steps_per_sec, 'tokens_per_sec': steps_per_sec * seq * batch,
          'mfu': peak and flops * steps_per_sec / peak}


if __name__ == '__main__':
  main()
