"""Time from process start to the first finished train step, split into phases.

    python -m benchmarks.startup [--exp lm.StdlibTiny] [--repeats 3] [--quick] [--keep]

Each repeat is a fresh child process. The parent notes the wall clock just before it starts the
child; the child times each phase around its own code (so the phases adding up to `total_s`
is a check, not an identity):
- `interpreter_s`: process start to the child's first statement (Python itself);
- `import_s`: jax and paxlike (train loop, registry, every experiment module);
- `init_s`: config build, `data_load_s` (the train and eval data, loaded and prepared once per
  machine into the tfds cache), `build.setup` and the state init, minus their compilation;
- `compile_s`: jaxpr tracing, lowering and XLA compilation (the time covered by
  `jax.monitoring`'s compile events), mostly setup's step and init; the other phases exclude it;
- `data_s`: the first step's batch (`loop.round_inputs`);
- `first_step_s`: running the first step to completion;
- `total_s`: process start to the first step done.
Medians over repeats; the first run on a machine also pays the tfds prepare (see `runs`).
`--keep` sets up as a CLI run does, its programs kept compiled beside the compilation cache
(core.program_store; the cache is JAX_COMPILATION_CACHE_DIR, else paxlike's default): every
repeat after the first then loads them (compare `init_s + compile_s` with and without it, each
run on a compilation cache of its own, as the first repeat of each compiles).
"""

import time

T0 = time.time()  # The child's first statement: the end of interpreter start-up.

import argparse  # noqa: E402
import contextlib  # noqa: E402

from benchmarks import common  # noqa: E402

COMPILE_EVENTS = ('/jax/core/compile/jaxpr_trace_duration',
                  '/jax/core/compile/jaxpr_to_mlir_module_duration',
                  '/jax/core/compile/backend_compile_duration')
PHASES = ('interpreter_s', 'import_s', 'init_s', 'data_load_s', 'compile_s', 'data_s',
          'first_step_s', 'total_s')


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = common.parser(__doc__, 'one run of a 1-layer model')
  parser.add_argument('--exp', default='lm.StdlibTiny')
  parser.add_argument('--set', action='append', default=[], metavar='PATH=VALUE')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--keep', action='store_true',
                      help='keep the compiled programs, as a CLI run does (core.program_store)')
  parser.add_argument('--child', type=float, help=argparse.SUPPRESS)  # The parent's launch time.
  args = parser.parse_args(argv)
  if args.quick:
    args.repeats = 1
    args.set = ['model.num_layers=1', *args.set]
  return args


@contextlib.contextmanager
def phase(spans: dict[str, tuple[float, float]], name: str, start: float | None = None):
  """Records the wall-clock (start, end) of the block as `spans[name]`."""
  start = time.time() if start is None else start
  yield
  spans[name] = (start, time.time())


def first_step(args: argparse.Namespace) -> dict[str, float]:
  """Child: runs up to the first finished step and returns the phase durations.

  Each phase is timed by its own clock readings around its own code, and `compile_s` is jax's
  own measure of its compile events, so that the phases add up to `total_s` is a check: it
  fails if work runs between phases or compile time is counted twice or missed.
  """
  spans: dict[str, tuple[float, float]] = {}
  compiles: list[tuple[float, float]] = []  # (start, end) of each compile event.

  def on_event(event: str, secs: float, **_) -> None:
    if event in COMPILE_EVENTS:  # Reported as it ends.
      now = time.time()
      compiles.append((now - secs, now))

  with phase(spans, 'import', start=T0):
    import jax
    from paxlike import registry
    from paxlike.config import config_io
    from paxlike.trainer import build, compile_cache, loop
    registry.import_all()
  with phase(spans, 'init'):
    jax.monitoring.register_event_duration_secs_listener(on_event)
    cfg = registry.get(args.exp)().config()
    config_io.apply_overrides(cfg, args.set)
    task = config_io.build(cfg)
    load_start = time.time()
    task.data.round_batches(task.train.seed, 0)  # Loads (and caches) the train split.
    task.data.eval_batches()                    # ... and the eval split.
    data_load_s = time.time() - load_start       # A part of init_s.
    kept_as = None
    if args.keep:  # As paxlike.main's train does.
      compile_cache.configure(compile_cache.default_dir())
      kept_as = build.kept_as(cfg, task)
    s = build.setup(task, kept_as=kept_as)
    with jax.set_mesh(s.program.mesh):
      state = jax.block_until_ready(s.program.init(jax.random.key(task.train.seed)))
  with phase(spans, 'data'):
    inputs = loop.round_inputs(s, 1)
  with phase(spans, 'first_step'):
    _, metrics = s.step(state, *inputs)
    jax.block_until_ready(metrics)
  end = time.time()
  # Each phase without its compilation, which compile_s counts once.
  phases = {f'{name}_s': b - a - covered(compiles, a, b) for name, (a, b) in spans.items()}
  return {'interpreter_s': T0 - args.child, **phases, 'data_load_s': data_load_s,
          'compile_s': covered(compiles, 0.0, end), 'total_s': end - args.child}


def covered(spans: list[tuple[float, float]], begin: float, end: float) -> float:
  """Time within [begin, end] covered by possibly overlapping spans (a jit traced inside
  another reports its own trace event, nested in the outer one's)."""
  total, reach = 0.0, begin
  for a, b in sorted(spans):
    a, b = max(a, reach), min(b, end)
    if b > a:
      total += b - a
      reach = b
  return total


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  if args.child is not None:
    common.emit(first_step(args))
    return
  machine = common.machine()
  runs = []
  for r in range(args.repeats):
    child = common.rerun(__spec__, f'--exp={args.exp}', *(f'--set={s}' for s in args.set),
                         *(['--keep'] if args.keep else []))
    runs.append(common.run_child([*child, f'--child={time.time()!r}']))
    common.log(f'  run {r + 1}/{args.repeats}: ' +
               ' '.join(f'{k} {v:.2f}' for k, v in runs[-1].items()))
  common.emit({'benchmark': 'startup', 'experiment': args.exp, 'overrides': args.set,
               'keep': args.keep,
               'repeats': args.repeats, 'machine': machine,
               **{k: round(common.median([r[k] for r in runs]), 3) for k in PHASES},
               'runs': [{k: round(v, 3) for k, v in r.items()} for r in runs]})


if __name__ == '__main__':
  main()
