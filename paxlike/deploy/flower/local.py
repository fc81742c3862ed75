"""A local Flower federation for an exported round: a SuperLink, N SuperNodes and `flwr run`,
each its own process group, all stopped at the end.

  python -m paxlike.deploy.flower.local --export_dir=DIR --rounds=R --nodes=N --out=OUT \
      --exp=federated.DigitsFedAvg [--fdl_set=PATH=VALUE ...]

The config flags are those the export was made with (paxlike.main's); a config whose hash is
not the plan's is refused (exit 2). Node k holds clients k, k + N, k + 2N, ... and reads them
through paxlike's data pipeline. OUT gets metrics.jsonl and final.npz (the ServerApp's), the
saved config, the Flower app and every process's log.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from absl import app, flags

from paxlike import main as cli
from paxlike.deploy.flower import processes, records
from paxlike.deploy.flower.rounds import clients_of_nodes

flags.DEFINE_string('export_dir', None, 'The export directory (python -m paxlike.export --out).')
flags.DEFINE_integer('rounds', 1, 'Rounds to run (at most the rounds the export holds).')
flags.DEFINE_integer('nodes', 2, 'SuperNodes to start.')
flags.DEFINE_string('out', None, 'New directory for the run (metrics.jsonl, final.npz, logs).')
flags.DEFINE_integer('round_timeout', 300, 'Seconds a round (or the nodes joining) may take.')
FLAGS = flags.FLAGS


def run_federation(export_dir: Path, config_json: str, out: Path, rounds: int, nodes: int,
                   num_clients: int, timeout: int) -> None:
  """Starts the federation, runs `rounds` rounds and stops every process; RunFailure when the
  ServerApp did not write all its rows."""
  from paxlike.errors import RunFailure
  out.mkdir(parents=True)
  (out / 'config.json').write_text(config_json)
  home, port = out / 'flwr_home', processes.free_port()
  processes.write_connection(home, 'local', f'127.0.0.1:{port}')
  processes.write_app(out / 'app', {
      'export-dir': str(export_dir.absolute()), 'config': str((out / 'config.json').absolute()),
      'out-dir': str((out / 'server').absolute()), 'rounds': rounds, 'nodes': nodes,
      'timeout': timeout})
  group = processes.Group(processes.flower_env(home), out / 'logs')
  bin_ = processes.BIN
  try:
    link = group.start('superlink', [str(bin_ / 'flower-superlink'), '--insecure',
                              '--disable-runtime-dependency-installation', '--host', '127.0.0.1',
                              '--port', str(port), '--database', str(out / 'superlink.db')])
    if not processes.wait_for_port(port, timeout, link):
      raise RunFailure(f'the SuperLink did not listen on port {port} (logs in {out / "logs"})')
    for k, clients in enumerate(clients_of_nodes(num_clients, nodes)):
      node_config = (f'export-dir="{export_dir.absolute()}" config="{out.absolute()}/config.json" '
                     f'clients="{",".join(map(str, clients))}" '
                     f'log="{out.absolute()}/logs/node{k}.jsonl"')
      group.start(f'node{k}', [str(bin_ / 'flower-supernode'), '--insecure',
                               '--superlink', f'127.0.0.1:{port}',
                               '--port', str(processes.free_port()),
                               '--node-config', node_config])
    runner = group.start('flwr_run', [str(bin_ / 'flwr'), 'run', str(out / 'app'), 'local',
                                      '--stream'])
    runner.wait(timeout=timeout * (rounds + 1))
  except subprocess.TimeoutExpired:
    raise RunFailure(f'the federation did not finish in {timeout * (rounds + 1)} s '
                     f'(logs in {out / "logs"})') from None
  finally:
    group.stop()
  rows = (out / 'server' / 'metrics.jsonl')
  done = len(rows.read_text().splitlines()) if rows.exists() else 0
  if done != rounds or not (out / 'server' / 'final.npz').exists():
    raise RunFailure(f'the ServerApp wrote {done} of {rounds} rounds (logs in {out / "logs"})')


def _stop_on_sigterm() -> None:
  """SIGTERM (a timeout, a CI cancel) unwinds like Ctrl-C, so the process groups are stopped."""
  def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f'signal {signum}')
  signal.signal(signal.SIGTERM, interrupt)


def run(argv: list[str]) -> None:
  from paxlike.config import config_io
  from paxlike.errors import UserError
  from paxlike.export import artifacts
  if len(argv) > 1:
    raise UserError(f'unexpected arguments: {" ".join(argv[1:])}')
  if not FLAGS.export_dir or not FLAGS.out:
    raise UserError('--export_dir and --out are required')
  if Path(FLAGS.out).exists():
    raise UserError(f'--out={FLAGS.out} exists; choose a new directory')
  plan = records.read_plan(FLAGS.export_dir)
  cli.use_local_settings()
  cfg = cli.task_config()
  config_json = config_io.to_json(cfg)
  if artifacts.config_hash(config_json) != plan['config_sha256']:
    raise UserError('the config flags do not give the config the export was made with '
                    f'(plan.json config_sha256 {plan["config_sha256"][:12]}…)')
  if not 1 <= FLAGS.rounds <= 10_000 or FLAGS.nodes < 1:
    raise UserError('--rounds and --nodes must be at least 1')
  _stop_on_sigterm()
  num_clients = config_io.build(cfg).data.num_clients
  run_federation(Path(FLAGS.export_dir), config_json, Path(FLAGS.out), FLAGS.rounds,
                 min(FLAGS.nodes, num_clients), num_clients, FLAGS.round_timeout)
  print((Path(FLAGS.out) / 'server' / 'metrics.jsonl').read_text(), end='')


def main(argv: list[str]) -> None:
  cli.run_reporting_errors(run, argv, 'paxlike.deploy.flower.local')


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags)
