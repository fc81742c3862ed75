"""Exports one round of an experiment's federated algorithm (docs/export.md).

  python -m paxlike.export --exp=federated.DigitsFedAvg --out=/tmp/fedavg_export \
      [--job_log_dir=JOB] [--rounds=R] [--fdl_set=PATH=VALUE ...]
  python -m paxlike.export.run --dir=/tmp/fedavg_export --rounds=R

Also `paxlike export ...`. The config comes from the shared config flags (paxlike.cli.flag_defs:
--exp or --fdl_config, --fdl_fiddler, --fdl_set).
The state is the latest checkpoint of --job_log_dir, else the run's initial state; the R rounds
of client batches, weights and rngs after it are the trainer's own (pure in (seed, step)).
Exit codes as `paxlike train`: 2 for a usage error or a round that cannot be exported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from absl import app, flags

from paxlike.cli import flag_defs
from paxlike.cli import program as cli
from paxlike.config import config_io

flag_defs.define(flag_defs.CONFIG)
flags.DEFINE_string('out', None, 'New (or empty) directory for plan.json and the programs.')
flags.DEFINE_integer('rounds', 1, 'Rounds of client inputs to export for the executor.')
FLAGS = flags.FLAGS


def cohort_algorithm(algorithm: Any) -> Callable[[int], Any]:
  """`n -> Algorithm` for a cohort of n: a fixed-cohort `algorithm` (DiLoCo's replicas, PAPA's
  population, ...) resized to n slots as it declares (`Algorithm.fixed_cohort`), any other
  unchanged."""
  fixed = algorithm.fixed_cohort
  return (lambda n: algorithm) if fixed is None else fixed.resized


def export_experiment(cfg: Any, out: Path, job_log_dir: str | None = None, rounds: int = 1,
                      experiment: str = '') -> dict[str, int]:
  """Writes the export directory for `cfg`; each artifact's size in bytes."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from paxlike.trainer import build, job_dir, loop, restore
  from paxlike.errors import UserError
  from paxlike.export import artifacts

  if rounds < 1:
    raise UserError(f'--rounds={rounds} must be at least 1')
  artifacts.check_new(out)
  task = config_io.build(cfg)
  if job_log_dir:
    setup, step, state = restore.load_latest_state(task, job_dir.existing(job_log_dir),
                                                   evaluator=False,
                                                   kept_as=build.kept_as(cfg, task))
  else:
    setup, step = build.setup(task, train_step=False, evaluator=False), 0
    with jax.set_mesh(setup.program.mesh):
      state = setup.program.init(jax.random.key(task.train.seed))
  with jax.set_mesh(setup.program.mesh):
    data = [dict(zip(('batches', 'weights', 'rng'), loop.round_inputs(setup, step + r)))
            for r in range(1, rounds + 1)]
  data = [{**d, 'batches': jax.device_get(d['batches']), 'weights': np.asarray(d['weights'])}
          for d in data]
  alg_state = jax.device_get(state.alg)
  # With LoRA (program.trainable) the trainer's own algorithm: the adapters trained, the base
  # frozen (paxlike/federated/lora.py); else the task's, as it declares itself.
  make = cohort_algorithm(setup.task.built_algorithm if setup.program.trainable is None
                          else setup.program.algorithm)
  one = jax.eval_shape(make(1).init, alg_state.params)
  client_state = jax.tree.map(lambda x, o: jnp.shape(x) != o.shape, alg_state, one)
  meta = {'experiment': experiment or '(--fdl_config)',
          'algorithm': getattr(task.algorithm, 'func', task.algorithm).__name__,
          'config_sha256': artifacts.config_hash(config_io.to_json(cfg)), 'start_step': step}
  return artifacts.export(
      out, lambda n: make(n).next, ['state', 'batches', 'weights', 'rng'],
      {'state': client_state, 'batches': jax.tree.map(lambda _: True, data[0]['batches']),
       'weights': True, 'rng': False},
      {'state': alg_state}, data, ['state', 'metrics'], meta)


def run(argv: list[str]) -> None:
  from paxlike.errors import UserError
  if len(argv) > 1:
    raise UserError(f'unexpected arguments: {" ".join(argv[1:])}')
  if not FLAGS.out:
    raise UserError('--out is required')
  cli.use_local_settings()
  sizes = export_experiment(cli.task_config(), Path(FLAGS.out), FLAGS.job_log_dir, FLAGS.rounds,
                            FLAGS.exp or '')
  for name, size in sizes.items():
    print(f'{name}\t{size}')


def main(argv: list[str]) -> None:
  cli.run_reporting_errors(run, argv, 'paxlike.export')


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags)
