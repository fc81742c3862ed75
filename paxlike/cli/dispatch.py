"""`paxlike COMMAND [ARGS]`: the command line's one entry (the console script and `python -m
paxlike`). It runs the subcommand of paxlike.cli.commands that ARGS name, as the program it is:
a job command here, a `python -m` program as `python -m` runs it (its own flags, output and
exit code), a checkout's script as `python SCRIPT` does. `paxlike --FLAG ...` with no command is
the older console script's form: `python -m paxlike.main --FLAG ...`."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from paxlike.cli.commands import COMMANDS, Command, find

CHECKOUT = Path(__file__).resolve().parents[2]
HELP = ('-h', '--help', 'help')


def usage() -> str:
  """The commands, each with what it does and the older command line it runs."""
  width = max(len(c.name) for c in COMMANDS)
  rows = [f'  {c.name:<{width}}  {c.summary}\n  {"":<{width}}  (= {c.same_as})'
          for c in COMMANDS]
  return '\n'.join(['usage: paxlike COMMAND [FLAGS]   (paxlike COMMAND --help: its flags)',
                    '', 'commands:', *rows])


def usage_error(message: str) -> None:
  """Exits 2 with `paxlike: error: MESSAGE` as the last line on stderr."""
  print(f'paxlike: error: {message}', file=sys.stderr)
  sys.exit(2)


def run_command(command: Command, args: list[str]) -> None:
  """Runs `command` on `args` as its program; the program ends the process or returns."""
  if command.mode is not None:
    from paxlike.cli import job_command  # Not before: the other programs import what they need.
    sys.argv = [f'paxlike {command.name}', *args]
    # absl's --help prints the __main__ module's docstring above the flags: this command's.
    sys.modules['__main__'].__doc__ = (f'paxlike {command.name}: {command.summary}\n'
                                       f'(the same as {command.same_as})\n')
    job_command.run_cli(command.mode)
  elif command.module is not None:
    sys.argv = [command.module, *args]  # runpy puts the module's file in sys.argv[0].
    runpy.run_module(command.module, run_name='__main__', alter_sys=True)
  else:
    script = CHECKOUT / command.script
    if not script.is_file():
      usage_error(f'paxlike {command.name} runs {command.script} of a source checkout, and '
                  f'{CHECKOUT} has none')
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.parent))  # As `python SCRIPT` puts its directory first.
    runpy.run_path(str(script), run_name='__main__')


def run_cli(argv: list[str] | None = None) -> None:
  """`paxlike ARGV` (default: sys.argv[1:]). Without a command: the usage, on stdout and exit 0
  for --help, else on stderr and exit 2."""
  argv = sys.argv[1:] if argv is None else argv
  if argv and argv[0] in HELP:
    print(usage())
    sys.exit(0)
  command, rest = find(argv)
  if command is not None:
    run_command(command, rest)
  elif argv and argv[0].startswith('-'):
    from paxlike.cli import job_command
    sys.argv = ['paxlike', *argv]
    job_command.run_cli(mode=None)
  else:
    what = f'unknown command {argv[0]!r}' if argv else 'no command given'
    print(usage(), file=sys.stderr)
    usage_error(what)
