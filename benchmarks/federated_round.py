"""FedAvg rounds/s as paxlike runs it against a FedJAX-style per-client loop.

    python -m benchmarks.federated_round [--cohorts 4,16,64] [--local-steps 4] [--chunk N] [--quick]

The task is `--exp` (default federated.ShakespeareFedAvg: `paxlike.configs.models.lm_tiny()` on Tiny
Shakespeare by role) with `data.seq_len`, `data.batch_size`, `data.clients_per_round` and
`data.local_steps` set from the flags. Per cohort, a child process times in alternating
repeats, on the same device-resident round batches:
- `paxlike`: `build.setup(task).step`, the default round: `algorithm.client_chunk` unset, so
  chosen per platform (paxlike/federated/chunking.py: one client at a time on CPU; all at once
  on accelerators or a sharded `clients` axis); `--chunk` sets it instead. The `clients` mesh
  axis spans `--devices` forced CPU devices when there are several;
- `loop`: FedJAX's `for_each_client` shape: one jitted local-training function (the same
  `client_update`: fresh client optimizer, H local steps, and the stats the round reports)
  called per client from Python, blocking on the previous client's output, a jitted weighted
  accumulate of params and stats, then the server step;
- `vmapped`: paxlike's step again with every client at once (`client_chunk` = the cohort).
All three start from the same params; `difference_from_paxlike` checks they agree after
their first round. Peak memory:
XLA's temp buffers of each compiled function, and the peak RSS of a fresh process per mode
that runs one round (`--no-rss` skips those; they run side by side). `ratio` is paxlike / loop
rounds/s at cohort 16 (else the middle cohort), `client_chunk` what the round used. Goal: >= 5
on an accelerator, >= 1 on CPU (where the round is compute-bound like the loop). `--profile DIR` adds each mode's XLA op time by kind
for one round (from a `jax.profiler` trace kept in DIR).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from benchmarks import common
from paxlike.data import sources
from paxlike.data.lm import LmData

GOALS = {'cpu': 1.0}  # Elsewhere 5.0.
MODES = ('paxlike', 'loop', 'vmapped')


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = common.parser(__doc__)
  parser.add_argument('--exp', default='federated.ShakespeareFedAvg')
  parser.add_argument('--set', action='append', default=[], metavar='PATH=VALUE')
  parser.add_argument('--cohorts', default='4,16,64')
  parser.add_argument('--local-steps', type=int, default=4)
  parser.add_argument('--seq-len', type=int, default=80)
  parser.add_argument('--batch-size', type=int, default=8)
  parser.add_argument('--chunk', type=int, help="paxlike's client_chunk (default: unset, chosen "
                      'per platform)')
  parser.add_argument('--devices', type=int, default=1, help='forced CPU devices per child')
  parser.add_argument('--data', choices=('real', 'synthetic'), default='real',
                      help="'real': the experiment's data (synthetic if it fails to load)")
  parser.add_argument('--rounds', type=int, default=1, help='rounds per timed repeat')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--no-rss', action='store_true', help='skip the per-mode RSS processes')
  parser.add_argument('--profile', type=Path, metavar='DIR',
                      help='trace one round per mode into DIR; op time by kind in the JSON')
  parser.add_argument('--child', choices=('time', 'memory'), help=argparse.SUPPRESS)
  parser.add_argument('--mode', choices=MODES, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.quick:
    args.cohorts, args.rounds, args.repeats = '4', 1, 1
    args.seq_len, args.batch_size = 16, 2
    args.set = ['model.num_layers=1', *args.set]
  return args


@dataclasses.dataclass
class SyntheticLm(sources.DataSource):
  """Uniform random byte windows in the shapes `LmData` gives (used when real data fails)."""

  seq_len: int
  batch_size: int
  clients_per_round: int
  local_steps: int
  eval_batch_size: int = 0  # One eval batch of batch_size rows (set in __post_init__).
  sampling: str = 'uniform'
  partition: str = 'iid'
  item: ClassVar[str] = 'tokens'
  vocab_size: ClassVar[int] = 256

  def __post_init__(self):
    self.eval_batch_size = self.batch_size

  def prepare(self) -> None:
    """Nothing is read: the batches are drawn from (seed, step)."""

  @property
  def client_sizes(self) -> np.ndarray:
    """A cohort's worth of equal clients (the windows are drawn, not owned)."""
    return np.ones(self.clients_per_round, np.int64)

  def row_spec(self) -> dict[str, sources.Spec]:
    return LmData.row_spec(self)  # The same windows.

  def describe(self) -> dict[str, Any]:
    return {'dataset': 'synthetic bytes', 'seq_len': self.seq_len}

  def round_batches(self, seed: int, step: int, clients: slice = slice(None),
                    rows: slice = slice(None)) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng([seed, step])
    shape = (self.clients_per_round, self.local_steps, self.batch_size, self.seq_len + 1)
    tokens = rng.integers(0, 256, shape, dtype=np.int32)[clients, :, rows]
    return ({'inputs': tokens[..., :-1], 'targets': tokens[..., 1:],
             'mask': np.ones(tokens.shape[:-1] + (self.seq_len,), np.float32)},
            np.ones(self.clients_per_round, np.float32))

  def eval_batches(self, rows: slice = slice(None)) -> list[dict[str, np.ndarray]]:
    batches, _ = SyntheticLm(self.seq_len, self.batch_size, 1, 1).round_batches(0, 0, rows=rows)
    return [{k: v[0, 0] for k, v in batches.items()}]


def build_task(args: argparse.Namespace, cohort: int) -> tuple[Any, str]:
  """The task for one cohort, and 'real' or 'synthetic' for the data it ended up with."""
  from paxlike import registry
  from paxlike.config import config_io
  registry.import_all()
  cfg = registry.get(args.exp)().config()
  clients_axis = math.gcd(args.devices, cohort)
  config_io.apply_overrides(cfg, [
      f'data.seq_len={args.seq_len}', f'data.batch_size={args.batch_size}',
      f'data.clients_per_round={cohort}', f'data.local_steps={args.local_steps}',
      f'mesh.ici=({clients_axis}, {args.devices // clients_axis})',
      "mesh.axes=('clients', 'data')", *args.set])
  task = config_io.build(cfg)
  if args.data == 'real':
    try:
      task.data.round_batches(task.train.seed, 1)
      return task, 'real'
    except Exception as error:  # The data layer may be mid-change; say so in the JSON.
      common.log(f'real data failed ({type(error).__name__}: {error}); using synthetic batches')
  synthetic = SyntheticLm(args.seq_len, args.batch_size, cohort, args.local_steps)
  return dataclasses.replace(task, data=synthetic), 'synthetic'


def temp_mb(compiled: Any) -> float | None:
  """XLA's temp (activation) buffer size of a compiled function, in MiB."""
  analysis = compiled.memory_analysis()
  return None if analysis is None else analysis.temp_size_in_bytes / 2**20


class Modes:
  """The three ways to run a round, over the same task, batches and starting params."""

  def __init__(self, task: Any, chunk: int | None, modes: tuple[str, ...]):
    import flax.linen as nn
    import jax
    import optax
    from paxlike.trainer import losses
    from paxlike.federated import clients

    self.jax, self.task = jax, task
    seed = task.train.seed
    host_batches, weights = task.data.round_batches(seed, 1)
    self.cohort = len(weights)
    self.weights = np.asarray(weights, np.float32)
    self.rng = jax.random.fold_in(jax.random.key(seed), 1)
    self.server_opt = task.algorithm.keywords.get('server_optimizer', optax.sgd(1.0))
    self.optimizer = task.optimizer
    update = clients.client_update(losses.model_loss_fn(task.model), task.optimizer)
    # A client's new params and its stats (the loss metrics the round reports, so the loop
    # does the same work: its local training, then a forward pass for `loss_after`).
    self.local = lambda params, batches, rng: update(
        params, self.optimizer.init(params), batches, rng)[::2]
    self.temp_mb: dict[str, float | None] = {}
    self.fns: dict[str, Any] = {}
    self.state: dict[str, Any] = {}

    with_chunk = lambda c: dataclasses.replace(
        task, algorithm=functools.partial(task.algorithm, client_chunk=c))
    if 'vmapped' in modes:
      params = self._build_paxlike('vmapped', with_chunk(self.cohort))
    if 'paxlike' in modes:
      params = self._build_paxlike('paxlike', task if chunk is None else with_chunk(chunk))
    elif 'vmapped' not in modes:
      sample = host_batches['inputs'][0, 0, :1]
      init = lambda key: nn.meta.unbox(task.model.init(key, sample)['params'])
      params = jax.jit(init)(jax.random.key(seed))
    # On one device, as the loop's jitted functions return it (so nothing recompiles later).
    server0 = jax.device_put((params, self.server_opt.init(params)), jax.devices()[0])
    self.initial = jax.device_get(server0[0])
    device_batches = jax.device_put(host_batches, jax.devices()[0])
    if 'loop' in modes:
      self._build_loop(device_batches, server0)

  def _build_paxlike(self, mode: str, task: Any) -> Any:
    """`mode` runs the trainer's compiled step of `task`; returns its initial params."""
    from paxlike.trainer import build, loop
    jax, s = self.jax, build.setup(task)
    with jax.set_mesh(s.program.mesh):
      self.state[mode] = s.program.init(jax.random.key(task.train.seed))
    inputs = loop.round_inputs(s, 1)

    def pax_round(state):
      state, metrics = s.step(state, *inputs)
      return state, metrics['loss']

    self.fns[mode] = pax_round
    self.temp_mb[mode] = temp_mb(s.step)
    return self.state[mode].alg.params

  def _server_step(self, params, server_opt_state, weighted_sum, weight_total):
    """FedAvg/FedOpt's server side: the optimizer on `params - weighted mean`. Returns the new
    server state and the pseudo-gradient norm (a metric paxlike's round computes too)."""
    import optax
    jax = self.jax
    mean = jax.tree.map(lambda s: s / weight_total, weighted_sum)
    pseudo_grad = jax.tree.map(lambda p, m: (p - m).astype(p.dtype), params, mean)
    updates, server_opt_state = self.server_opt.update(pseudo_grad, server_opt_state, params)
    return (optax.apply_updates(params, updates), server_opt_state), optax.tree.norm(pseudo_grad)

  def _build_loop(self, batches: Any, server0: Any) -> None:
    jax = self.jax
    keys = list(jax.random.split(self.rng, self.cohort))
    client_batches = [jax.tree.map(lambda x, c=c: x[c], batches) for c in range(self.cohort)]
    local = jax.jit(self.local)
    accumulate = jax.jit(lambda total, p, w: jax.tree.map(lambda t, x: t + w * x, total, p),
                         donate_argnums=0)
    server = jax.jit(self._server_step, donate_argnums=(1,))
    weights, total_weight = [float(w) for w in self.weights], float(self.weights.sum())
    self.temp_mb['loop'] = temp_mb(local.lower(server0[0], client_batches[0], keys[0]).compile())
    client_shape = jax.eval_shape(self.local, server0[0], client_batches[0], keys[0])
    zeros = jax.jit(lambda: jax.tree.map(lambda s: jax.numpy.zeros(s.shape, s.dtype), client_shape))

    def loop_round(server_state):
      params, server_opt_state = server_state
      total, previous = zeros(), None
      for c in range(self.cohort):
        client = local(params, client_batches[c], keys[c])
        total = accumulate(total, client, weights[c])
        if previous is not None:  # ≤ 2 clients in flight, as every loop here runs.
          jax.block_until_ready(previous)
        previous = client
      (params, server_opt_state), pseudo_grad_norm = server(
          params, server_opt_state, total[0], total_weight)
      stats = jax.tree.map(lambda s: s / total_weight, total[1])  # The round's client metrics.
      return (params, server_opt_state), (pseudo_grad_norm, stats)

    self.state['loop'] = jax.tree.map(lambda x: x.copy(), server0)
    self.fns['loop'] = loop_round

  def params(self, mode: str) -> Any:
    state = self.state[mode]
    return state.alg.params if mode in ('paxlike', 'vmapped') else state[0]

  def round(self, mode: str) -> Any:
    """Runs one round of `mode`; returns a scalar metric of it to block on (the state itself
    is donated to the next round)."""
    self.state[mode], metric = self.fns[mode](self.state[mode])
    return metric

  def differences(self) -> dict[str, dict[str, float]]:
    """After the same rounds of each, every mode's params against paxlike's: the largest
    absolute difference, and the difference's norm relative to the norm of paxlike's change
    from the initial params (float noise through Adam's normalisation stays well under 1%)."""
    leaves = lambda tree: [np.asarray(x, np.float64) for x in self.jax.tree.leaves(tree)]
    norm = lambda xs: float(np.sqrt(sum(np.sum(x * x) for x in xs)))
    ref, init = leaves(self.params('paxlike')), leaves(self.initial)
    change = norm([r - i for r, i in zip(ref, init)])
    out = {}
    for mode in self.fns:
      if mode != 'paxlike':
        diff = [r - x for r, x in zip(ref, leaves(self.params(mode)))]
        out[mode] = {'max_abs': max(float(np.max(np.abs(d))) for d in diff),
                     'relative': norm(diff) / change}
    return out


def time_cohort(args: argparse.Namespace, cohort: int) -> dict:
  """Child: rounds/s of every mode at one cohort, alternating."""
  task, data = build_task(args, cohort)
  modes = Modes(task, args.chunk, MODES)
  for mode in modes.fns:
    modes.jax.block_until_ready(modes.round(mode))
  diff = modes.differences()
  rate = lambda mode: lambda: args.rounds / common.timed_loop(
      functools.partial(modes.round, mode), args.rounds)
  values = common.alternate({mode: rate(mode) for mode in modes.fns}, args.repeats)
  out = {f'{mode}_rounds_per_sec': common.median(v) for mode, v in values.items()}
  if args.profile:
    out['profile_op_ms'] = {mode: common.profile_op_ms(
        functools.partial(modes.round, mode), args.profile / f'cohort{cohort}' / mode)
        for mode in modes.fns}
  out['ratio'] = common.paired_ratio(values['paxlike'], values['loop'])
  out['vmapped_ratio'] = common.paired_ratio(values['vmapped'], values['loop'])
  from paxlike.federated import chunking
  chunk = args.chunk or chunking.default_client_chunk(
      modes.jax.default_backend(), math.gcd(args.devices, cohort))
  return {'cohort': cohort, 'data': data, 'client_chunk': chunk, **out,
          'difference_from_paxlike': diff,
          'xla_temp_mb': modes.temp_mb,
          'spread': {m: round(common.spread(v), 3) for m, v in values.items()}}


def memory_of(args: argparse.Namespace, cohort: int, mode: str) -> dict:
  """Child: builds only `mode`, runs a round and reports this process's peak RSS."""
  task, _ = build_task(args, cohort)
  modes = Modes(task, args.chunk, (mode,))
  if mode not in modes.fns:
    return {'peak_rss_mb': None}
  modes.jax.block_until_ready(modes.round(mode))
  return {'peak_rss_mb': round(common.peak_rss_mb(), 1)}


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  cohorts = [int(c) for c in args.cohorts.split(',')]
  if args.child == 'time':
    common.emit(time_cohort(args, cohorts[0]))
    return
  if args.child == 'memory':
    common.emit(memory_of(args, cohorts[0], args.mode))
    return
  import jax  # Only the parent's modules; children pick their own device count.
  goal = GOALS.get(jax.default_backend(), 5.0)
  forwarded = [f'--exp={args.exp}', f'--local-steps={args.local_steps}',
               f'--seq-len={args.seq_len}', f'--batch-size={args.batch_size}',
               *([f'--chunk={args.chunk}'] if args.chunk else []),
               f'--devices={args.devices}', f'--data={args.data}',
               f'--rounds={args.rounds}', f'--repeats={args.repeats}',
               *(f'--set={s}' for s in args.set),
               *([f'--profile={args.profile.resolve()}'] if args.profile else [])]
  env = common.child_env(args.devices)
  machine = common.machine()
  results = []
  for cohort in cohorts:
    common.log(f'federated_round: cohort {cohort}')
    row = common.run_child(common.rerun(__spec__, '--child=time', f'--cohorts={cohort}',
                                        *forwarded), env)
    if not args.no_rss:  # One process per mode, run side by side: they measure memory only.
      outs = common.run_children([common.rerun(__spec__, '--child=memory', f'--mode={mode}',
                                               f'--cohorts={cohort}', *forwarded)
                                  for mode in MODES], env)
      row['peak_rss_mb'] = {mode: out['peak_rss_mb'] for mode, out in zip(MODES, outs)}
    results.append(row)
  headline = next((r for r in results if r['cohort'] == 16), results[len(results) // 2])
  common.emit({
      'benchmark': 'federated_round', 'experiment': args.exp, 'overrides': args.set,
      'data': sorted({r['data'] for r in results}),
      'local_steps': args.local_steps, 'seq_len': args.seq_len, 'batch_size': args.batch_size,
      'chunk': args.chunk, 'devices': args.devices, 'rounds': args.rounds,
      'repeats': args.repeats, 'machine': machine, 'jax': jax.__version__,
      'ratio': headline['ratio'], 'ratio_cohort': headline['cohort'],
      'goal': goal, 'goal_met': headline['ratio'] >= goal,
      'rounds_per_sec': {str(r['cohort']): r['paxlike_rounds_per_sec'] for r in results},
      'cohorts': results,
  })


if __name__ == '__main__':
  main()
