"""A MoE train step against a dense one with the same active parameters, on the same mesh.

    python -m benchmarks.moe [--devices 8] [--mesh data=2,expert=4] [--steps 10] [--repeats 3]
                             [--quick] [--no-dropless]

The MoE model is a TransformerLM (vocab 256, 2 layers, d 128, 4 heads, seq 128, batch 16) whose
MLPs are `--experts` experts of width 256 with top-`--k` routing (capacity factor 1.25); the
dense model has the same shape with one MLP of width k × 256, so both run the same matmul
FLOPs per token (the MoE adds its router, d × E per layer). Both train with paxlike's loss and
centralized AdamW step, jitted on the same mesh (forced CPU devices on a CPU host: the work
runs in a child process that sees `--devices` of them; on a GPU host set `--devices` to the
GPU count). On the mesh the dense model treats 'expert' as one more data axis. Timed in
alternating repeats, at most 2 steps in flight, as the trainer runs.

Dropless (unless `--no-dropless`): two more sides of the same MoE with no capacity,
`dropless_every_expert` (capacity factor E/k, so C = T slots: every expert computes every
token, which is what `capacity_factor=None` computed before issue 68) and `dropless_grouped`
(`capacity_factor=None`: each token through its k experts, `layers/moe_dispatch.py`); the
`dropless` entry holds grouped / every-expert ratios of XLA's FLOPs and of step time, measured
in the same run.

Prints one JSON object: per side `ms_per_step` (median), `params`, `active_params` (the
matmul params a token uses: lm_flops.matmul_params), `flops_per_token` and the compiled step's
`all_to_all` count and `xla_flops` (XLA's cost analysis of the compiled step: the program of
one device, so on an N-way mesh about 1/N of the step's work); the MoE side adds the routing
statistics of its last step; `ratio` is MoE / dense step time.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys

from benchmarks import common


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = common.parser(__doc__)
  parser.add_argument('--devices', type=int, default=8, help='forced CPU devices of the child')
  parser.add_argument('--mesh', default='data=2,expert=4', help='axis=size,... (ici)')
  parser.add_argument('--experts', type=int, default=8)
  parser.add_argument('--k', type=int, default=2, help='experts per token')
  parser.add_argument('--steps', type=int, default=10, help='steps per timed repeat')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--no-dropless', dest='dropless', action='store_false',
                      help='skip the two dropless sides')
  parser.add_argument('--child', action='store_true', help=argparse.SUPPRESS)
  return parser.parse_args(argv)


def models(args: argparse.Namespace):
  """({side: model}, seq_len, batch): the MoE, the dense model with the same active params
  and (`args.dropless`) the two dropless MoEs."""
  from paxlike.layers import TransformerLM
  d, layers, width, seq, batch = (32, 1, 32, 16, 8) if args.quick else (128, 2, 256, 128, 16)
  shape = dict(vocab_size=256, num_layers=layers, d_model=d, num_heads=4, max_len=seq)
  sparse = TransformerLM(**shape, d_ff=width, num_experts=args.experts,
                         experts_per_token=args.k, capacity_factor=1.25)
  sides = {'moe': sparse, 'dense': TransformerLM(**shape, d_ff=args.k * width)}
  if args.dropless:
    sides['dropless_every_expert'] = sparse.clone(capacity_factor=args.experts / args.k)
    sides['dropless_grouped'] = sparse.clone(capacity_factor=None, moe_dispatch='blocks')
  return sides, seq, batch


def count_ops(hlo: str, op: str) -> int:
  """How many `op` instructions (sync or async start) a compiled module's text has."""
  return len(re.findall(rf'= [^=]*\b{op}(?:-start)?\(', hlo))


def side(model, mesh_cfg, batch):
  """(time `n` steps -> seconds, facts about the side) for one model."""
  import flax.linen as nn
  import jax
  import optax
  from paxlike.families import lm_flops
  from paxlike.core import partitioning
  from paxlike.trainer import losses
  from paxlike.trainer.centralized import centralized
  mesh = partitioning.make_mesh(mesh_cfg)
  alg = centralized(losses.model_loss_fn(model), optax.adamw(1e-3))
  sample = batch['inputs'][0, 0, :1]
  with jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.rules_for_mesh(mesh_cfg.rules,
                                                                            mesh)):
    boxed = jax.eval_shape(model.init, jax.random.key(0), sample)['params']
    shardings = partitioning.logical_shardings(boxed, mesh, mesh_cfg.rules)
    params = jax.jit(lambda key: nn.unbox(model.init(key, sample))['params'],
                     out_shardings=shardings)(jax.random.key(0))
    state = {'s': jax.jit(alg.init)(params)}
    data = partitioning.host_to_global(batch, partitioning.round_batch_sharding(mesh))
    weights, rng = jax.numpy.ones(1), jax.random.key(0)
    step = jax.jit(alg.next, donate_argnums=0)
    compiled = step.lower(state['s'], data, weights, rng).compile()
    hlo = compiled.as_text()
    last = {}

    def one():
      state['s'], last['metrics'] = step(state['s'], data, weights, rng)
      return last['metrics']['loss']

    jax.block_until_ready(one())  # Compile.
  facts = {'params': sum(math.prod(x.shape) for x in jax.tree.leaves(params)),
           'active_params': lm_flops.matmul_params(model),
           'flops_per_token': lm_flops.flops_per_token(model, batch['inputs'].shape[-1]),
           'all_to_all': count_ops(hlo, 'all-to-all'),
           'xla_flops': float(compiled.cost_analysis()['flops'])}
  return (lambda n: common.timed_loop(one, n)), facts, last


def child(args: argparse.Namespace) -> None:
  import jax
  import numpy as np
  from paxlike.core.partitioning import MeshConfig
  sizes = dict(item.split('=') for item in args.mesh.split(','))
  mesh_cfg = MeshConfig(ici=tuple(int(v) for v in sizes.values()), axes=tuple(sizes))
  models_by_side, seq, batch = models(args)
  sparse, dense = models_by_side['moe'], models_by_side['dense']
  steps, repeats = (2, 1) if args.quick else (args.steps, args.repeats)
  tokens = np.random.default_rng(0).integers(0, 256, (1, 1, batch, seq + 1))
  data = {'inputs': tokens[..., :-1].astype(np.int32), 'targets': tokens[..., 1:].astype(np.int32),
          'mask': np.ones((1, 1, batch, seq), np.float32)}
  sides = {name: side(model, mesh_cfg, data) for name, model in models_by_side.items()}
  times = common.alternate({name: (lambda s=s: s[0](steps)) for name, s in sides.items()}, repeats)
  result = {'benchmark': 'moe', 'platform': jax.devices()[0].platform,
            'devices': jax.device_count(), 'mesh': {k: int(v) for k, v in sizes.items()},
            'model': {'d_model': sparse.d_model, 'num_layers': sparse.num_layers, 'seq_len': seq,
                      'batch': batch, 'num_experts': sparse.num_experts,
                      'experts_per_token': sparse.experts_per_token, 'expert_d_ff': sparse.d_ff,
                      'dense_d_ff': dense.d_ff},
            'steps': steps, 'repeats': repeats, 'quick': args.quick, **common.machine()}
  for name, (_, facts, last) in sides.items():
    result[name] = {'ms_per_step': 1e3 * statistics.median(times[name]) / steps, **facts}
  metrics = sides['moe'][2]['metrics']
  result['moe'].update({key: float(metrics[key]) for key in metrics if key.startswith('moe_')})
  result['ratio'] = result['moe']['ms_per_step'] / result['dense']['ms_per_step']
  if args.dropless:
    grouped, every = result['dropless_grouped'], result['dropless_every_expert']
    result['dropless'] = {'flops_ratio': grouped['xla_flops'] / every['xla_flops'],
                          'ms_ratio': grouped['ms_per_step'] / every['ms_per_step']}
  common.emit(result)


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  if args.child:
    child(args)
    return
  forwarded = [a for a in (argv if argv is not None else sys.argv[1:])]
  common.emit(common.run_child(common.rerun(__spec__, *forwarded, '--child'),
                               env=common.child_env(args.devices)))


if __name__ == '__main__':
  main()
