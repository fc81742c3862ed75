"""`paxlike COMMAND`: the command line's one entry. Its help lists the subcommands, each
subcommand's `--help` gives that program's flags, and a subcommand's run is its older `python
-m` form's run: the same output and exit code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from paxlike.cli.commands import COMMANDS, find
from tests.helpers import REPO, cli_env

CONSOLE_SCRIPT = Path(sys.executable).parent / 'paxlike'
# What each subcommand's --help must list (a flag of its own, or its own subcommand).
HELP_SHOWS = {'train': 'restore_fallback:', 'eval': '--job_log_dir', 'decode': '--prompt',
              'print_config': '--fdl_set', 'list': 'paxlike list', 'export': '--rounds',
              'export run': '--dir', 'hf': '--step', 'flower': '--export_dir',
              'tokenizers': 'train', 'reproduce': '--quick'}


def run(*args: str, script: bool = False) -> subprocess.CompletedProcess:
  """`python ARGS` (or the installed console script's ARGS) in the checkout, one CPU device."""
  command = [str(CONSOLE_SCRIPT)] if script else [sys.executable]
  return subprocess.run([*command, *args], cwd=REPO, env=cli_env(1), text=True,
                        capture_output=True, timeout=300)


def test_the_table_names_the_eight_commands_and_finds_the_longest():
  names = {c.name for c in COMMANDS}
  assert {'train', 'eval', 'decode', 'export', 'hf', 'flower', 'tokenizers', 'reproduce'} <= names
  assert set(HELP_SHOWS) == names
  assert find(['export', 'run', '--dir=x'])[0].module == 'paxlike.export.run'
  assert find(['export', '--out=x']) == (next(c for c in COMMANDS if c.name == 'export'),
                                         ['--out=x'])
  assert find(['--exp=lm.StdlibTiny']) == (None, ['--exp=lm.StdlibTiny'])


@pytest.mark.parametrize('script', [False, True], ids=['python -m paxlike', 'console script'])
def test_help_lists_every_subcommand(script):
  done = run('--help', script=script) if script else run('-m', 'paxlike', '--help')
  assert done.returncode == 0, done.stderr[-2000:]
  listed = {line.split()[0] for line in done.stdout.splitlines() if line.startswith('  ')
            and not line.strip().startswith('(')}
  assert {c.words[0] for c in COMMANDS} <= listed
  for command in COMMANDS:
    assert f'(= {command.same_as})' in done.stdout


def test_no_command_or_an_unknown_one_is_a_usage_error():
  for args in ([], ['nope']):
    done = run('-m', 'paxlike', *args)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith('paxlike: error: ')


@pytest.mark.parametrize('command', COMMANDS, ids=lambda c: c.name)
def test_each_subcommand_has_its_help(command):
  done = run('-m', 'paxlike', *command.words, '--help')
  assert HELP_SHOWS[command.name] in done.stdout, done.stdout + done.stderr[-2000:]
  if command.module is not None:  # The program's own help, as `python -m` gives it.
    older = run('-m', command.module, '--help')
    assert (done.returncode, done.stdout) == (older.returncode, older.stdout)
  if command.mode in ('train', 'eval', 'print_config'):
    assert '  --prompt:' not in done.stdout and '  --mode:' not in done.stdout


def test_a_job_command_prints_what_its_older_form_prints():
  args = ['--exp=lm.StdlibTiny', '--fdl_set=model.num_layers=1']
  new = run('-m', 'paxlike', 'print_config', *args)
  old = run('-m', 'paxlike.main', '--mode=print_config', *args)
  assert new.returncode == old.returncode == 0, new.stderr[-2000:]
  assert new.stdout == old.stdout and 'model.num_layers = 1' in new.stdout


def test_a_program_command_runs_as_its_python_m_form(tmp_path):
  (tmp_path / 'corpus.txt').write_text('the quick brown fox jumps over the lazy dog\n' * 50)
  args = ['train', f'--files={tmp_path}/corpus.txt', '--vocab_size=280', '--kind=bpe',
          f'--out={tmp_path / "tok"}', '--overwrite']
  new = run('-m', 'paxlike', 'tokenizers', *args)
  old = run('-m', 'paxlike.tokenizers', *args)
  assert new.returncode == old.returncode == 0, new.stderr[-2000:]
  assert new.stdout == old.stdout and 'tokenizer.json vocab_size=' in new.stdout
  refused = [run(*prefix, '--exp=federated.NoSuch', f'--out={tmp_path / "e"}')
             for prefix in (['-m', 'paxlike', 'export'], ['-m', 'paxlike.export'])]
  assert refused[0].returncode == refused[1].returncode == 2
  assert refused[0].stderr == refused[1].stderr


def test_reproduce_runs_the_checkouts_script():
  new = run('-m', 'paxlike', 'reproduce', '--list')
  old = run(str(REPO / 'scripts' / 'reproduce.py'), '--list')
  assert new.returncode == old.returncode == 0, new.stderr[-2000:]
  assert new.stdout == old.stdout and 'fedavg' in new.stdout


def test_the_console_script_keeps_its_older_flags_only_form():
  args = ['--exp=lm.StdlibTiny', '--mode=print_config']
  new, old = run(*args, script=True), run('-m', 'paxlike.main', *args)
  assert new.returncode == old.returncode == 0, new.stderr[-2000:]
  assert new.stdout == old.stdout
