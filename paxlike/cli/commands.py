"""The subcommands of `paxlike`: each is a job command (paxlike.cli.job_command, on the shared
flags of flag_defs) or a `python -m` program it runs as that program (the same flags, output and
exit code), or a script of the source checkout. Adding a command is one row here."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Command:
  """`paxlike NAME ARGS`: the job command `mode`, or `python -m module ARGS`, or `python
  script ARGS` (a path under the checkout's root)."""

  name: str
  summary: str
  mode: str | None = None
  module: str | None = None
  script: str | None = None

  def __post_init__(self):
    if [self.mode, self.module, self.script].count(None) != 2:
      raise ValueError(f'command {self.name!r}: give one of mode, module and script')

  @property
  def words(self) -> tuple[str, ...]:
    return tuple(self.name.split())

  @property
  def same_as(self) -> str:
    """The older command line this one runs."""
    if self.mode == 'list':
      return 'python -m paxlike.main --list'
    if self.mode is not None:
      return f'python -m paxlike.main --mode={self.mode}'
    if self.module is not None:
      return f'python -m {self.module}'
    return f'python {self.script}'


COMMANDS = (
    Command('train', 'Train an experiment in --job_log_dir (resuming it).', mode='train'),
    Command('eval', "Print the held-out metrics of a job's latest checkpoint.", mode='eval'),
    Command('decode', "Sample text after --prompt from an LM job's latest checkpoint.",
            mode='decode'),
    Command('print_config', "Print an experiment's config, size and memory.",
            mode='print_config'),
    Command('list', 'List the registered experiments (key, origin, summary).', mode='list'),
    Command('export', "Export a round of a federated experiment's algorithm (--out=DIR).",
            module='paxlike.export'),
    Command('export run', 'Run the rounds of an export directory (--dir=DIR).',
            module='paxlike.export.run'),
    Command('hf', "Write an LM job's checkpoint as a Hugging Face directory.",
            module='paxlike.interop.hf'),
    Command('flower', 'Run an exported round on a local Flower federation.',
            module='paxlike.deploy.flower.local'),
    Command('tokenizers', 'Train a tokenizer on local text files (tokenizers train ...).',
            module='paxlike.tokenizers'),
    Command('reproduce', "Reproduce a paper's result at small scale (source checkout only).",
            script='scripts/reproduce.py'),
)


def find(argv: list[str]) -> tuple[Command | None, list[str]]:
  """The command that `argv` (after `paxlike`) names, by its longest run of leading words, and
  the arguments after them; (None, argv) when it names none."""
  best = None
  for command in COMMANDS:
    if tuple(argv[:len(command.words)]) == command.words and (
        best is None or len(command.words) > len(best.words)):
      best = command
  return best, argv[len(best.words):] if best else argv
