"""`python -m paxlike COMMAND [FLAGS]`: the `paxlike` command (paxlike.cli.dispatch)."""

from paxlike.cli import dispatch

if __name__ == '__main__':
  dispatch.run_cli()
