"""What every config-taking program of paxlike does around its work: the task config and the
machine's settings from the shared flags (flag_defs.CONFIG), errors as one line and an exit
code, and a quick exit once done. `paxlike train`, `export` and `flower` all run through it."""

from __future__ import annotations

import atexit
import os
import sys
from typing import Callable

import fiddle as fdl
from absl import app, flags, logging

from paxlike.cli import run_config
from paxlike.errors import RunFailure, UserError
from paxlike.trainer import job_source

FLAGS = flags.FLAGS


def task_config() -> fdl.Config:
  """The config to run (see `run_config`): the job dir's saved config when it has one, else
  --fdl_config or --exp; then fiddlers, then --fdl_set overrides."""
  return run_config.run_config(
      FLAGS.job_log_dir, FLAGS.exp, FLAGS.fdl_config, FLAGS.fdl_fiddler, FLAGS.fdl_set,
      FLAGS.allow_import, FLAGS.allow_config_change, fill_from_source=fill_from_init_source)


def fill_from_init_source(cfg: fdl.Config) -> None:
  """With `train.init_from`, the model fields and the data's tokenizer that the config leaves
  unset come from the source (an HF dir's config.json and tokenizer, another job's config). A
  job dir's saved config is complete already, so a resumed fine-tune never reads its source."""
  init_from = cfg.train.init_from
  if not init_from:
    return
  from paxlike.trainer import init_from as source
  model = source.model_overrides_from(init_from)
  tokenizer = source.init_source_tokenizer(init_from)
  for name, value in model.items():
    if name not in cfg.model.__arguments__:
      setattr(cfg.model, name, value)
  if tokenizer and job_source.tokenizer_of(cfg.data) and 'tokenizer' not in cfg.data.__arguments__:
    cfg.data.tokenizer = tokenizer


def use_local_settings() -> None:
  """The data root, --verify_data and the compilation cache, from the flags (before any data
  or compile)."""
  if FLAGS.data_dir:
    os.environ['PAXLIKE_DATA_DIR'] = FLAGS.data_dir
  if FLAGS.verify_data:  # Read by paxlike.data.token_store in this process and its children.
    os.environ['PAXLIKE_VERIFY_DATA'] = '1'
  from paxlike.trainer import compile_cache
  compile_cache.configure(compile_cache.default_dir() if FLAGS.compilation_cache_dir is None
                          else FLAGS.compilation_cache_dir)


def run_reporting_errors(run_fn: Callable[[list[str]], None], argv: list[str], prog: str) -> None:
  """`run_fn(argv)` with absl's INFO logs off unless asked; a UserError exits 2 and a RunFailure
  1, each as one line on stderr prefixed by `prog`; stdout closed by its reader exits 0 quietly."""
  if not FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  try:
    run_fn(argv)
    sys.stdout.flush()  # Here, so a closed pipe is caught below and not at exit.
  except BrokenPipeError:  # `--list | head -1`: the reader has what it wanted.
    os._exit(0)
  except UserError as error:
    exit_with(2, f'{prog}: error: {error}')
  except RunFailure as error:
    exit_with(1, f'{prog}: failed: {error}')


def exit_with(code: int, message: str) -> None:
  """Prints `message` as the last line on stderr and exits at once.

  Skips interpreter teardown: after a failed Orbax restore, its asyncio machinery can print an
  unrelated traceback while being garbage-collected, burying the one line that matters.
  """
  print(message, file=sys.stderr)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing with usage errors reported as one line and exit code 2."""
  try:
    return FLAGS(argv)
  except flags.Error as error:
    print(f'paxlike: error: {error}', file=sys.stderr)
    sys.exit(2)


def run_quick_exit(main: Callable[[list[str]], None]) -> None:
  """`app.run(main)` with paxlike's flag parser. A run that succeeds exits once its output is
  flushed and its atexit handlers have run (jax.distributed's shutdown among them), skipping
  the interpreter's teardown: about 0.3 s of module and XLA client destructors on every run (an
  eighth of a warm decode's) that free nothing the operating system does not. Every file a run
  writes is closed by then (the trainer closes its checkpoints and writers itself)."""
  try:
    app.run(main, flags_parser=parse_flags)
  except SystemExit as done:
    if done.code not in (None, 0):
      raise
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(0)
