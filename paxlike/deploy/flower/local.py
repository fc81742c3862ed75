"""A local Flower federation for an exported round: a SuperLink, N SuperNodes and `flwr run`,
each its own process group, all stopped at the end.

  python -m paxlike.deploy.flower.local --export_dir=DIR --rounds=R --nodes=N --out=OUT \
      --exp=federated.DigitsFedAvg [--fdl_set=PATH=VALUE ...] [--secure_aggregation]

The config flags are those the export was made with (flag_defs.CONFIG); a config whose hash is
not the plan's is refused (exit 2). The SuperLink serves TLS with a certificate of a CA made
for the run and admits only the N nodes whose keys the launcher enrolled. Node k holds clients
k, k + N, k + 2N, ... and reads them through paxlike's data pipeline. OUT/server gets
metrics.jsonl, cohorts.jsonl, nodes.jsonl, the Orbax checkpoints and final.npz (the
ServerApp's); OUT also holds the saved config, the credentials, the Flower app, runs.json
(Flower's record of the runs) and every process's log. With --secure_aggregation the sums go
through Flower's SecAgg+ (secure.py); a plan whose clients keep individual values is refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from absl import app, flags

from paxlike.cli import flag_defs
from paxlike.cli import program as cli
from paxlike.deploy.flower import (federation, launches, processes, records, supervise,
                                   warm_clientapp)
from paxlike.deploy.flower.rounds import clients_of_nodes

flag_defs.define(flag_defs.CONFIG)
flags.DEFINE_string('export_dir', None, 'The export directory (python -m paxlike.export --out).')
flags.DEFINE_integer('rounds', 1, 'Rounds to run (at most the rounds the export holds).')
flags.DEFINE_integer('nodes', 2, 'SuperNodes to start.')
flags.DEFINE_string('out', None, 'Directory for the run (metrics.jsonl, final.npz, logs): a new '
                    'one, or that of an interrupted run of the same config, which resumes.')
flags.DEFINE_integer('round_timeout', 300, 'Seconds a round (or the nodes joining) may take; '
                     'a node that has not replied by then is lost.')
flags.DEFINE_bool('secure_aggregation', False, 'Sum the clients\' contributions with Flower\'s '
                  'SecAgg+ (the server sees only sums over the nodes; docs/flower.md).')
flags.DEFINE_integer('server_restarts', 2, 'Times the app is submitted again when its ServerApp '
                     'stops before the last round (it resumes from its last checkpoint).')
flags.DEFINE_bool('warm_clientapp', True, 'Fork each ClientApp process from a server that has '
                  'imported Flower, JAX and paxlike (warm_clientapp.py) instead of starting a '
                  'fresh `flwr-clientapp` per message.')
FLAGS = flags.FLAGS


def node_config(export_dir: Path, out: Path, clients: list[int], name: str) -> str:
  """A SuperNode's `--node-config`: the export, the saved config, its clients, its log, and
  where it keeps its clients' state (OUT/nodes/NAME: kept across launches, so a resumed run's
  nodes find it)."""
  return (f'export-dir="{export_dir.absolute()}" config="{out.absolute()}/config.json" '
          f'clients="{",".join(map(str, clients))}" log="{out.absolute()}/logs/{name}.jsonl" '
          f'state-dir="{out.absolute()}/nodes/{name}"')


def _save_runs(fed: federation.Federation, path: Path) -> None:
  """Flower's own record of the runs (status, times, network traffic) as `flwr ls` prints it."""
  path.write_text(fed.flwr('ls', federation.CONNECTION, '--format', 'json').stdout)


def start_warm_clientapp(group: processes.Group, socket: Path, bin_dir: Path
                         ) -> subprocess.Popen:
  """The warm ClientApp server in `group`: it writes the flwr-clientapp shim into `bin_dir`,
  imports, then listens on `socket` (until then, or if it fails, the shim runs the real one)."""
  return group.start('warm_clientapp', [
      sys.executable, '-m', 'paxlike.deploy.flower.warm_clientapp', '--socket', str(socket),
      '--bin-dir', str(bin_dir.absolute())])


def _prepare_out(export_dir: Path, config_json: str, out: Path, rounds: int, timeout: int,
                 secure_aggregation: bool) -> int:
  """Locks `out` (the lock's descriptor), says where a resumed run continues (keeping its old
  logs aside), and writes the run's config and the Flower app."""
  out.mkdir(parents=True, exist_ok=True)
  lock = launches.lock_out(out)
  if (out / 'config.json').exists():
    launches.keep_old_logs(out)
    print(f'resuming {out} after round {launches.last_checkpoint(out) or 0} (its last '
          'checkpoint)', file=sys.stderr)
  (out / 'config.json').write_text(config_json)
  processes.write_app(out / 'app', {
      'export-dir': str(export_dir.absolute()), 'config': str((out / 'config.json').absolute()),
      'out-dir': str((out / 'server').absolute()), 'rounds': rounds,
      'timeout': timeout, 'secure-aggregation': int(secure_aggregation)},
      'paxlike.deploy.flower.secure_client:app' if secure_aggregation
      else 'paxlike.deploy.flower.client_app:app')
  return lock


def run_federation(export_dir: Path, config_json: str, out: Path, rounds: int, nodes: int,
                   population: int, timeout: int, restarts: int,
                   secure_aggregation: bool = False, warm: bool = True) -> None:
  """Starts the federation (TLS, only the nodes it enrolled; with `warm`, their ClientApp
  processes forked by a warm server), runs `rounds` rounds, submitting the app again up to
  `restarts` times when its ServerApp stops early (it resumes from its checkpoint), and stops
  every process; RunFailure when the rows are not all written."""
  from paxlike.errors import RunFailure
  lock = _prepare_out(export_dir, config_json, out, rounds, timeout, secure_aggregation)
  bin_dir = out / 'warm_bin'
  group = processes.Group(processes.flower_env(out / 'flwr_home', bin_dir if warm else None),
                          out / 'logs', lock)
  fed = federation.Federation(group, out, processes.free_port())
  budget = timeout * (rounds + 2)
  socket = warm_clientapp.socket_path(out)
  try:
    # The warm server imports while the SuperLink starts.
    server = start_warm_clientapp(group, socket, bin_dir) if warm else None
    fed.start_superlink(timeout)

    def submit(attempt: int) -> subprocess.Popen:
      return group.start(f'flwr_run{attempt}', [
          str(processes.BIN / 'flwr'), 'run', str(out / 'app'), federation.CONNECTION,
          '--stream'])

    def join(name: str, clients: list[int]) -> subprocess.Popen:
      return fed.start_node(name, fed.new_identity(name),
                            node_config(export_dir, out, clients, name))

    runner = submit(0)  # The ServerApp starts up while the nodes enroll; it waits for them.
    if server is not None:  # Before the nodes start, so that their first message is forked.
      processes.wait_for_path(socket, 120, server)
    names = [f'node{k}' for k in range(nodes)]
    with ThreadPoolExecutor(8) as pool:  # Each enrollment is a `flwr` process: side by side.
      started = list(pool.map(join, names, clients_of_nodes(population, nodes)))
    watch = supervise.Supervisor(fed, dict(zip(names, started)), group.logs / 'supervisor.log')
    for attempt in range(restarts + 1):
      runner = runner if attempt == 0 else submit(attempt)
      watch.wait(runner, group.logs / f'flwr_run{attempt}.log', time.monotonic() + budget)
      if launches.rows_done(out) == rounds or launches.disk_full(out):
        break  # A ServerApp started again on a full disk would fail the same way.
    _save_runs(fed, out / 'runs.json')
  except subprocess.TimeoutExpired:
    raise RunFailure(f'the federation did not finish in {budget} s '
                     f'(logs in {out / "logs"})') from None
  except launches.Stopped:
    launches.wait_for_last_checkpoint(out)
    raise
  finally:
    group.stop()
    os.close(lock)
  if launches.rows_done(out) != rounds or not (out / 'server' / 'final.npz').exists():
    if launches.disk_full(out):
      raise RunFailure(launches.no_space_message(out, out / 'server'))
    why = launches.server_app_failure(out / 'runs.json')
    raise RunFailure(f'the ServerApp wrote {launches.rows_done(out)} of {rounds} rounds '
                     f'({why + "; " if why else ""}logs in {out / "logs"})')


def run(argv: list[str]) -> None:
  from paxlike.config import config_io
  from paxlike.errors import RunFailure, UserError
  from paxlike.export import artifacts
  if len(argv) > 1:
    raise UserError(f'unexpected arguments: {" ".join(argv[1:])}')
  if not FLAGS.export_dir or not FLAGS.out:
    raise UserError('--export_dir and --out are required')
  if (missing := flower_missing()) is not None:
    raise UserError(missing)
  if not (Path(FLAGS.export_dir) / 'plan.json').is_file():
    raise UserError(f'--export_dir={FLAGS.export_dir} holds no plan.json (make one with '
                    'python -m paxlike.export)')
  plan = records.read_plan(FLAGS.export_dir)
  cli.use_local_settings()
  cfg = cli.task_config()
  config_json = config_io.to_json(cfg)
  if artifacts.config_hash(config_json) != plan['config_sha256']:
    raise UserError('the config flags do not give the config the export was made with '
                    f'(plan.json config_sha256 {plan["config_sha256"][:12]}…)')
  if not 1 <= FLAGS.rounds <= 10_000 or FLAGS.nodes < 1 or FLAGS.server_restarts < 0:
    raise UserError('--rounds and --nodes must be at least 1, --server_restarts at least 0')
  if FLAGS.secure_aggregation:
    from paxlike.deploy.flower import secure
    if (reason := secure.refusal(plan)) is not None:
      raise UserError(reason)
    if (reason := secure.nodes_refusal(FLAGS.nodes)) is not None:
      raise UserError(reason)
  out = Path(FLAGS.out)
  launches.resumable(out, config_json)
  task = config_io.build(cfg)
  population = records.population(task.data)
  if FLAGS.nodes > population:  # A node holds clients k, k + N, ...: one would hold none.
    raise UserError(f'--nodes={FLAGS.nodes} is more than the experiment\'s {population} '
                    f'client{"s" * (population != 1)} (data.num_clients); each node must hold '
                    'one' + (', and --secure_aggregation needs 3 nodes that hold clients'
                             if FLAGS.secure_aggregation else ''))
  launches.stop_on_signals()
  if launches.rows_done(out) != FLAGS.rounds or not (out / 'server' / 'final.npz').exists():
    try:
      run_federation(Path(FLAGS.export_dir), config_json, out, FLAGS.rounds,
                     FLAGS.nodes, population, FLAGS.round_timeout,
                     FLAGS.server_restarts, FLAGS.secure_aggregation, FLAGS.warm_clientapp)
    except OSError as error:  # Writing the run's files (runs.json, the app, credentials).
      if error.errno not in launches.NO_SPACE:
        raise
      raise RunFailure(launches.no_space_message(out, error.filename or out)) from None
    except launches.Stopped as stop:
      cli.exit_with(0, f'paxlike.deploy.flower.local: stopped by {stop} after round '
                       f'{launches.last_step(out) or 0} of {FLAGS.rounds} (checkpointed in '
                       f'{out / "server" / "checkpoints"}); the same command resumes')
  print((out / 'server' / 'metrics.jsonl').read_text(), end='')


def flower_missing() -> str | None:
  """Why this Python cannot run a Flower federation (one line naming what is missing), or
  None."""
  try:
    import flwr  # noqa: F401
  except ImportError as error:
    return (f'the Flower launcher needs the flwr package (pip install flwr==1.42.0), which '
            f'{sys.executable} cannot import ({error})')
  for tool in ('flower-superlink', 'flower-supernode', 'flwr'):
    if not (processes.BIN / tool).exists():
      return f'the flwr package\'s {tool} is not beside {sys.executable} (pip install flwr==1.42.0)'
  return None


def main(argv: list[str]) -> None:
  cli.run_reporting_errors(run, argv, 'paxlike.deploy.flower.local')


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags)
