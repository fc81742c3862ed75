"""paxlike's command line.

  python -m paxlike.main --exp=lm.StdlibTiny --job_log_dir=/tmp/run [--fdl_set=train.num_steps=200]
  python -m paxlike.main --list

The job commands with --mode (train, eval, decode, print_config): `paxlike train ...` and the
other subcommands of `paxlike` (paxlike/cli/commands.py) are the same programs.
Exit codes: 0 success, 2 usage or config error, 1 runtime failure; errors are one line on stderr.
"""

from __future__ import annotations

from paxlike.cli import job_command
from paxlike.cli.flag_defs import FLAGS, MODES  # noqa: F401 (this module's public names)
from paxlike.cli.program import (  # noqa: F401 (this module's public names)
    exit_with,
    parse_flags,
    run_reporting_errors,
    task_config,
    use_local_settings,
)

job_command.define_flags(mode=None)


def run(argv: list[str]) -> None:
  """Dispatches on --mode. Raises UserError/RunFailure for the caller to turn into exit codes."""
  job_command.run(argv)


def main(argv: list[str]) -> None:
  job_command.main(argv)


def run_cli() -> None:
  """`python -m paxlike.main`: the job command of --mode (paxlike.cli.job_command)."""
  job_command.run_cli(mode=None)


if __name__ == '__main__':
  run_cli()
