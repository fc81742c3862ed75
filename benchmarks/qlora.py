"""LoRA over a quantized base (QLoRA) against LoRA over the float base: step time and memory.

    python -m benchmarks.qlora [--steps 20] [--repeats 3] [--rank 8] [--quick]
    python -m benchmarks.qlora --preset 8b --batch 1 --seq 2048 --kinds int8,nf4  # one TPU chip

A 4-layer d256 Llama-shaped TransformerLM (vocab 256, 4 heads of 64, d_ff 1024, seq 128, batch
8, bf16 compute), rank-`--rank` adapters on every projection, AdamW on the adapters alone
(`centralized(..., trainable=lora_mask)`), with the base's kernels stored as each of `--kinds`
(`model.base_quantization`: none = float32, int8, nf4 with double quantization). Timed in
alternating repeats with at most 2 steps in flight (a `--preset`'s kinds one after another,
each freed before the next: an 8B's int8 and NF4 bases would not fit one chip together).
Prints one JSON object: per kind `ms_per_step` (median), `param_bytes` (the stored params),
`xla_bytes` (XLA's figure for the compiled step: its peak on an accelerator, arguments +
outputs − aliased + temporaries on CPU) and `estimate_bytes` (paxlike's memory estimate), and
each kind's ratios to `none`. `--profile DIR` then traces `--profile-steps` steps of each kind
into DIR/KIND with `jax.profiler` and adds `profile`, where the device time goes
(benchmarks/profile_summary.py).

`--preset 8b` (or 1b, 350m) builds paxlike/configs/models.py's preset instead (random weights,
params other than the quantized kernels in bfloat16, remat 'full') at `--batch` × `--seq` on
whatever accelerator there is, and adds `mfu` (6·N + attention FLOPs per token over the chip's
peak, as the MFU benchmarks count them; a LoRA step skips the base's weight gradients, a third of
that).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from benchmarks import common
from benchmarks.lora import nbytes, rates

TARGETS = ('query', 'key', 'value', 'out', 'wi_gate', 'wi_up', 'wo')


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = common.parser(__doc__)
  parser.add_argument('--steps', type=int, default=20, help='steps per timed repeat')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--rank', type=int, default=8)
  parser.add_argument('--kinds', default='none,int8,nf4')
  parser.add_argument('--preset', choices=('350m', '1b', '8b'),
                      help='a paxlike/configs/models.py size')
  parser.add_argument('--batch', type=int, default=1, help='with --preset')
  parser.add_argument('--seq', type=int, default=2048, help='with --preset')
  parser.add_argument('--profile', type=Path, help='trace each kind\'s steps into DIR/KIND')
  parser.add_argument('--profile-steps', type=int, default=2)
  return parser.parse_args(argv)


def base_model(args: argparse.Namespace):
  """(the float base model with adapters, its shape, seq, batch)."""
  import fiddle as fdl
  import jax.numpy as jnp
  from paxlike.configs import models as model_configs
  from paxlike.layers import TransformerLM
  if args.preset:
    model = fdl.build(getattr(model_configs, f'lm_{args.preset}')())
    model = model.clone(param_dtype=jnp.bfloat16, remat_policy='full', max_len=args.seq)
    seq, batch = args.seq, args.batch
  else:
    d, layers, seq, batch = (128, 2, 32, 2) if args.quick else (256, 4, 128, 8)
    model = TransformerLM(vocab_size=256, num_layers=layers, d_model=d, num_heads=d // 64,
                          d_ff=4 * d, max_len=seq, tied_embeddings=False, dtype=jnp.bfloat16,
                          scan_layers=True, remat_policy='dots')
  model = model.clone(lora_rank=args.rank, lora_targets=TARGETS)
  shape = {'preset': args.preset, 'num_layers': model.num_layers, 'd_model': model.d_model,
           'vocab_size': model.vocab_size}
  return model, shape, seq, batch


def side(model, batch):
  """(run one step -> its loss, stored param bytes, XLA's bytes for the step)."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import optax
  from paxlike.layers.lora import lora_mask
  from paxlike.trainer import build, losses
  from paxlike.trainer.centralized import centralized
  init = jax.jit(lambda key: nn.meta.unbox(model.init(key, batch['inputs'][0, 0, :1])['params']))
  params = init(jax.random.key(0))
  alg = centralized(losses.model_loss_fn(model), optax.adamw(1e-3), trainable=lora_mask)
  param_bytes = nbytes(params)
  # Donated: the state takes over the params' buffers (an 8B base has no room for two).
  state = {'s': jax.jit(alg.init, donate_argnums=0)(params)}
  del params
  weights, rng = jnp.ones(1), jax.random.key(0)
  step = jax.jit(alg.next, donate_argnums=0).lower(state['s'], batch, weights, rng).compile()

  def one():
    state['s'], metrics = step(state['s'], batch, weights, rng)
    return metrics['loss']

  jax.block_until_ready(one())
  return one, param_bytes, build.compiled_bytes(step)


def profiled(one, directory: Path, steps: int) -> dict:
  """Where `steps` calls of `one` spend the device's time (a trace kept in `directory`)."""
  from benchmarks import profile_summary
  wall = profile_summary.trace(one, directory, steps)
  return {'dir': str(directory), **profile_summary.summarize(directory, steps, wall_s=wall)}


def estimate_bytes(model, seq: int, batch: int) -> float:
  """paxlike's memory estimate (`--mode=print_config`'s) for this model, batch and seq."""
  import dataclasses
  import optax
  from paxlike import registry
  from paxlike.config import config_io
  from paxlike.families import lm_memory
  registry.import_all()
  cfg = registry.get('lm.StdlibTiny')().config()  # Its data and mesh; this model, optimizer.
  config_io.apply_overrides(cfg, [f'data.seq_len={seq}', f'data.batch_size={batch}'])
  task = dataclasses.replace(config_io.build(cfg), model=model, optimizer=optax.adamw(1e-3))
  return lm_memory.estimate(task, 1).total


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  import jax
  import jax.numpy as jnp
  import numpy as np
  steps, repeats = (2, 2) if args.quick else (args.steps, args.repeats)
  model, shape, seq, batch = base_model(args)
  tokens = np.random.default_rng(0).integers(0, 256, (1, 1, batch, seq + 1))
  data = {'inputs': jnp.asarray(tokens[..., :-1]), 'targets': jnp.asarray(tokens[..., 1:]),
          'mask': jnp.ones((1, 1, batch, seq), jnp.float32)}
  kinds = args.kinds.split(',')
  models = {k: model.clone(base_quantization=k) for k in kinds}
  sides, times, profiles = {}, {}, {}
  for kind in kinds:
    common.log(f'qlora: compiling {kind}')
    sides[kind] = side(models[kind], data)
    if args.preset:  # One base at a time: an 8B's int8 and NF4 bases do not fit together.
      times[kind] = [common.timed_loop(sides[kind][0], steps) for _ in range(repeats)]
      if args.profile:
        profiles[kind] = profiled(sides[kind][0], args.profile / kind, args.profile_steps)
      sides[kind] = (None, *sides[kind][1:])  # Its state goes with its step.
  if not args.preset:
    times = common.alternate(
        {k: (lambda one=s[0]: common.timed_loop(one, steps)) for k, s in sides.items()}, repeats)
    if args.profile:
      profiles = {k: profiled(s[0], args.profile / k, args.profile_steps) for k, s in sides.items()}
  result = {'model': {**shape, 'seq_len': seq, 'batch': batch}, 'lora_rank': args.rank,
            'steps': steps, 'repeats': repeats, 'device_kind': jax.devices()[0].device_kind}
  for kind, (_, params, xla) in sides.items():
    row = {'ms_per_step': 1e3 * statistics.median(times[kind]) / steps, 'param_bytes': params,
           'xla_bytes': xla}
    if not args.preset:
      row['estimate_bytes'] = estimate_bytes(models[kind], seq, batch)
    else:
      row.update(rates(models[kind], seq, batch, row['ms_per_step']))
    if kind in profiles:
      row['profile'] = profiles[kind]
    result[kind] = row
  if 'none' in result:
    for kind in kinds[1:] if kinds[0] == 'none' else [k for k in kinds if k != 'none']:
      result[kind]['time_vs_none'] = result[kind]['ms_per_step'] / result['none']['ms_per_step']
      result[kind]['params_vs_none'] = result[kind]['param_bytes'] / result['none']['param_bytes']
  common.emit(result)


if __name__ == '__main__':
  main()
