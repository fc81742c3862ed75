"""paxlike's train step against a hand-written `jax.jit` + optax step of the same model.

    python -m benchmarks.overhead [--devices 1,8] [--steps 30] [--repeats 5] [--quick]

For each device count a child process (`XLA_FLAGS=--xla_force_host_platform_device_count=N`)
builds the experiment through the registry, `config_io.build` and `build.setup`, then times, in
alternating repeats on the same device-resident batch:
- `paxlike`: the compiled `Trainer.step` (the algorithm's round, metrics, sharding, donation);
- `baseline`: `jax.jit(step, donate_argnums=(0, 1))` of value_and_grad of the mean
  cross-entropy + `task.optimizer` on the same Flax module, params, mesh and logical rules;
- `paxlike_with_data`: `Trainer.step` fed by `loop.round_inputs` each step, as the trainer does.
Prints one JSON object; `ratio` is the median over repeats of paxlike / baseline steps/s (the
worst device count; per device count under `devices`, with `ratio_best`, best over best, and
each step's XLA FLOPs and all-reduce count). Goal: ratio >= 0.97.
"""

from __future__ import annotations

import argparse
import re

from benchmarks import common

GOAL = 0.97


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = common.parser(__doc__)
  parser.add_argument('--exp', default='lm.StdlibTiny')
  parser.add_argument('--set', action='append', default=[], metavar='PATH=VALUE',
                      help='config override, as --fdl_set (repeatable)')
  parser.add_argument('--devices', default='1,8', help='comma-separated device counts')
  parser.add_argument('--steps', type=int, default=30, help='steps per timed repeat')
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--warmup', type=int, default=3)
  parser.add_argument('--child', action='store_true', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.quick:
    args.steps, args.repeats, args.warmup = 3, 1, 1
    args.set = ['model.num_layers=1', *args.set]
  return args


def measure(args: argparse.Namespace) -> dict:
  """Runs in the child: builds both steps on this process's devices and times them."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import optax
  from jax.sharding import NamedSharding, PartitionSpec as P

  from paxlike import registry
  from paxlike.config import config_io
  from paxlike.core import partitioning
  from paxlike.families.shapes import step_flops_per_device
  from paxlike.trainer import build, loop

  registry.import_all()
  cfg = registry.get(args.exp)().config()
  config_io.apply_overrides(cfg, args.set)
  task = config_io.build(cfg)
  s = build.setup(task, evaluator=False)  # Nothing here evaluates.
  mesh, model, optimizer = s.program.mesh, task.model, task.optimizer
  rules = partitioning.rules_for_mesh(task.mesh.rules, mesh)
  with jax.set_mesh(mesh):
    pax_state = s.program.init(jax.random.key(task.train.seed))
  batches, weights, rng = loop.round_inputs(s, 1)

  # The baseline: what a user would write by hand for the same model, optimizer and mesh.
  host_batches, _ = task.data.round_batches(task.train.seed, 1)
  batch = partitioning.host_to_global(
      {k: v[0, 0] for k, v in host_batches.items()},
      NamedSharding(mesh, P(partitioning.batch_axes(mesh) or None)))
  shardings = jax.tree.map(lambda a: a.sharding, s.program.abstract_state.alg)
  copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree),
                 out_shardings=(shardings.params, shardings.opt_state))
  params, opt_state = copy((pax_state.alg.params, pax_state.alg.opt_state))

  def loss_fn(params, batch):
    logits = model.apply({'params': params}, batch['inputs'])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch['targets']).mean()

  def step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    baseline_step = jax.jit(step, donate_argnums=(0, 1),
                            out_shardings=(shardings.params, shardings.opt_state, None))
    baseline_step = baseline_step.lower(params, opt_state, batch).compile()

  state = {'pax': pax_state, 'base': (params, opt_state)}
  counter = {'step': 1}

  def pax_step():
    state['pax'], metrics = s.step(state['pax'], batches, weights, rng)
    return metrics['loss']

  def pax_step_with_data():
    counter['step'] += 1
    state['pax'], metrics = s.step(state['pax'], *loop.round_inputs(s, counter['step']))
    return metrics['loss']

  def base_step():
    p, o, loss = baseline_step(*state['base'], batch)
    state['base'] = (p, o)
    return loss

  def rate(step_fn):
    return lambda: args.steps / common.timed_loop(step_fn, args.steps)

  for fn in (pax_step, base_step, pax_step_with_data):
    common.timed_loop(fn, args.warmup)
  values = common.alternate({'paxlike': rate(pax_step), 'baseline': rate(base_step),
                             'paxlike_with_data': rate(pax_step_with_data)}, args.repeats)
  return {
      'devices': jax.device_count(),
      'mesh': dict(mesh.shape),
      'paxlike_steps_per_sec': common.median(values['paxlike']),
      'baseline_steps_per_sec': common.median(values['baseline']),
      'paxlike_with_data_steps_per_sec': common.median(values['paxlike_with_data']),
      'ratio': common.paired_ratio(values['paxlike'], values['baseline']),
      'ratio_best': max(values['paxlike']) / max(values['baseline']),
      'spread': {k: round(common.spread(v), 3) for k, v in values.items()},
      # Where a gap would come from: extra work or extra collectives in the compiled step.
      'flops_per_device': {'paxlike': step_flops_per_device(s.step),
                           'baseline': step_flops_per_device(baseline_step)},
      'all_reduces': {'paxlike': all_reduces(s.step), 'baseline': all_reduces(baseline_step)},
  }


def all_reduces(compiled) -> int:
  """All-reduce instructions in a compiled step's HLO."""
  return len(re.findall(r'\ball-reduce(?:-start)?\(', compiled.as_text()))


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  if args.child:
    common.emit(measure(args))
    return
  forwarded = [f'--exp={args.exp}', f'--steps={args.steps}', f'--repeats={args.repeats}',
               f'--warmup={args.warmup}', *(f'--set={s}' for s in args.set)]
  results = {}
  machine = common.machine()
  for devices in (int(d) for d in args.devices.split(',')):
    common.log(f'overhead: {args.exp} on {devices} device(s)')
    results[str(devices)] = common.run_child(common.rerun(__spec__, '--child', *forwarded),
                                             env=common.child_env(devices))
  ratio = min(r['ratio'] for r in results.values())
  common.emit({
      'benchmark': 'overhead', 'experiment': args.exp, 'overrides': args.set,
      'steps': args.steps, 'repeats': args.repeats, 'machine': machine,
      'ratio': ratio, 'goal': GOAL, 'goal_met': ratio >= GOAL,
      'steps_per_sec': {d: r['paxlike_steps_per_sec'] for d, r in results.items()},
      'baseline_steps_per_sec': {d: r['baseline_steps_per_sec'] for d, r in results.items()},
      'devices': results,
  })


if __name__ == '__main__':
  main()
