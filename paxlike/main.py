"""paxlike's command line.

  python -m paxlike.main --exp=lm.StdlibTiny --job_log_dir=/tmp/run [--fdl_set=train.num_steps=200]
  python -m paxlike.main --list

Exit codes: 0 success, 2 usage or config error, 1 runtime failure; errors are one line on stderr.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from typing import Callable

from absl import app, flags, logging

from paxlike import registry
from paxlike.cli import run_config
from paxlike.config import config_io
from paxlike.trainer import job_dir, job_source
from paxlike.trainer.restore_fallback import FALLBACKS
from paxlike.errors import RunFailure, UserError

MODES = ('train', 'eval', 'decode', 'print_config')

flags.DEFINE_string('exp', None, 'Registered experiment key or unique suffix (e.g. lm.StdlibTiny), '
                    'or my_package.my_module.MyExperiment, which imports my_package.my_module.')
flags.DEFINE_string('job_log_dir', None, 'Directory for checkpoints, metrics and summaries.')
flags.DEFINE_string('mode', 'train', f'One of {", ".join(MODES)}.')
flags.DEFINE_bool('list', False, 'List the registered experiments (key, origin, summary) and exit.')
flags.DEFINE_multi_string('fdl_set', [], 'PATH=VALUE override of a task config field (repeatable).')
flags.DEFINE_string('fdl_config', None, 'A serialized config.json to run instead of --exp.')
flags.DEFINE_multi_string('fdl_fiddler', [], 'A fiddler from configs/fiddlers.py (or an allowed '
                          'dotted name) applied to the config before the overrides.')
flags.DEFINE_multi_string('allow_import', [], 'Extra module allowed in --fdl_config/--fdl_fiddler.')
flags.DEFINE_string('data_dir', None, 'Data root (else $PAXLIKE_DATA_DIR, else ../shared/data).')
flags.DEFINE_bool('verify_data', False, 'Hash every corpus file and check the token store '
                  'again, instead of trusting their recorded size and times.')
flags.DEFINE_bool('allow_config_change', False, 'Resume a job dir whose saved config differs.')
flags.DEFINE_string('compilation_cache_dir', None, 'Persistent XLA compilation cache, so a rerun '
                    'skips compiling (default: ~/.cache/paxlike/jax; empty: off).')


class _FallbackParser(flags.EnumParser):
  """`--restore_fallback` alone (or =true) means `previous`; `--norestore_fallback` means `off`."""

  def parse(self, argument):
    return super().parse({'true': 'previous', 'false': 'off'}.get(str(argument).lower(), argument))


flags.DEFINE_flag(flags.Flag(
    _FallbackParser(FALLBACKS), flags.ArgumentSerializer(), 'restore_fallback', 'off',
    'If the latest checkpoint is corrupt: off (fail), previous (restore the newest readable '
    'step; fail if none is), from_scratch (as previous, but start from step 0 if none is).',
    boolean=True))
flags.DEFINE_string('prompt', 'def ', 'Decode: the text to continue.')
flags.DEFINE_string('prompts_file', None, 'Decode: a file of prompts, one per line (a batch).')
flags.DEFINE_integer('decode_length', 200, 'Decode: the most tokens to sample per prompt.')
flags.DEFINE_integer('top_k', 0, 'Decode: sample among the k likeliest tokens (0 = all).')
flags.DEFINE_float('top_p', 1.0, 'Decode: sample within the smallest set of probability p.')
flags.DEFINE_float('temperature', 0.8, 'Decode: sampling temperature (0 = greedy).')
flags.DEFINE_integer('decode_seed', 0, 'Decode: sampling seed.')
flags.DEFINE_bool('chat', False, "Decode: each prompt is a user turn of the tokenizer's chat "
                  'template (with its generation prompt); the reply stops at its end of turn.')
flags.DEFINE_string('coordinator_address', None, 'Multi-process: host:port of process 0.')
flags.DEFINE_integer('num_processes', None, 'Multi-process: number of processes.')
flags.DEFINE_integer('process_id', None, 'Multi-process: this process, in [0, num_processes).')
flags.DEFINE_integer('distributed_init_timeout', 300, 'Multi-process: seconds to wait for all '
                     'processes to join.')
flags.DEFINE_integer('heartbeat_timeout', 60, 'Multi-process: seconds after which a silent peer '
                     'counts as dead and the survivors exit non-zero.')
FLAGS = flags.FLAGS


def task_config():
  """The config to run (see `run_config`): the job dir's saved config when it has one, else
  --fdl_config or --exp; then fiddlers, then --fdl_set overrides."""
  return run_config.run_config(
      FLAGS.job_log_dir, FLAGS.exp, FLAGS.fdl_config, FLAGS.fdl_fiddler, FLAGS.fdl_set,
      FLAGS.allow_import, FLAGS.allow_config_change, fill_from_source=fill_from_init_source)


def fill_from_init_source(cfg) -> None:
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


def run(argv: list[str]) -> None:
  """Dispatches on --mode. Raises UserError/RunFailure for the caller to turn into exit codes."""
  if len(argv) > 1:
    raise UserError(f'unexpected arguments: {" ".join(argv[1:])}')
  if FLAGS.list:
    registry.import_all()
    print(registry.listing())
    return
  if FLAGS.mode not in MODES:
    raise UserError(f'--mode={FLAGS.mode!r} is not one of {", ".join(MODES)}')
  use_local_settings()
  cfg = task_config()
  task = config_io.build(cfg)
  if FLAGS.mode == 'print_config':
    print_config(cfg, task)
    return
  if not FLAGS.job_log_dir:
    raise UserError(f'--job_log_dir is required for --mode={FLAGS.mode}')
  request = None
  if FLAGS.mode == 'decode':  # Checked before anything is compiled.
    from paxlike.cli.decode_text import DecodeRequest, Sampling
    from paxlike.families import family_of
    if not family_of(task.model).can_decode:
      raise UserError('--mode=decode needs a language model experiment')
    request = DecodeRequest(FLAGS.decode_length,
                            Sampling(FLAGS.temperature, FLAGS.top_k, FLAGS.top_p),
                            FLAGS.decode_seed)
    family_of(task.model).kernel_line(task.model, task.data)  # A forced kernel this platform lacks.
  # Heavy imports only once a job really runs.
  from paxlike.trainer import distributed
  distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id,
                         FLAGS.distributed_init_timeout, FLAGS.heartbeat_timeout)
  if FLAGS.mode == 'train':
    train(cfg, task)
  elif FLAGS.mode == 'eval':
    evaluate(cfg, task)
  else:
    decode(task, request)


def print_config(cfg, task) -> None:
  """The config as text, the model's size, FLOPs and memory lines, and a DP run's budget."""
  from paxlike.cli.config_lines import model_summary
  from paxlike.families import family_of
  from paxlike.trainer import privacy
  print(config_io.to_text(cfg) + model_summary(task) + family_of(task.model).memory_summary(task),
        end='')
  accountant = privacy.accountant(task)
  if accountant is not None:
    print(accountant.describe(task.train.num_steps))


def train(cfg, task) -> None:
  """Trains `task` in --job_log_dir (resuming it), recording its config and data there."""
  from paxlike.data import fingerprint
  from paxlike.families import family_of
  from paxlike.trainer import build, distributed, loop
  key = build.kept_as(cfg, task)
  data = key.data  # Recorded in the job dir.
  # Checks mesh, data and model before the job dir is touched.
  trainer = build.setup(task, kept_as=key)
  with job_dir.undone_if_refused(FLAGS.job_log_dir):  # E.g. an init_from of another shape.
    directory = job_dir.prepare(FLAGS.job_log_dir, cfg, FLAGS.allow_config_change,
                                [*FLAGS.allow_import, *registry.trusted_modules()])
    notes = family_of(task.model).kernel_line(task.model, task.data) + task.data.config_lines()

    def on_start() -> None:  # Restored: say which attention kernel runs, record config, data.
      print(notes.replace('# ', ''), end='', file=sys.stderr)
      copied = job_source.localize(directory, cfg)  # The saved config names the copies.
      if copied:
        print(f'copied {", ".join(copied)} into {directory / job_source.SOURCE_DIR}',
              file=sys.stderr)
      job_dir.record_config(directory, cfg, notes)
      fingerprint.record(directory, data)

    with job_dir.trainer_lock(directory, distributed.is_primary(), distributed.primary_value):
      fingerprint.check_resume(directory, data, FLAGS.allow_config_change)
      loop.train(trainer, directory, restore_fallback=FLAGS.restore_fallback,
                 allow_config_change=FLAGS.allow_config_change, on_start=on_start)
  if distributed.is_primary():
    print(f'results in {directory}: metrics.jsonl, checkpoints/, summaries/ (tensorboard '
          f'--logdir {directory / "summaries"})', file=sys.stderr)


def evaluate(cfg, task) -> None:
  """Prints the held-out metrics of --job_log_dir's latest checkpoint as one JSON line (no
  train step is compiled; the init and eval step kept by a run of this config are loaded)."""
  from paxlike.data import fingerprint
  from paxlike.trainer import build, restore
  directory = job_dir.existing(FLAGS.job_log_dir)
  key = build.kept_as(cfg, task)
  trainer, step, state = restore.load_latest_state(task, directory, kept_as=key)
  differs = fingerprint.mismatch(directory, key.data)
  if differs:  # Still evaluated (on today's data), but not silently.
    print(f'warning: {differs}; these eval numbers are on the data as it is now', file=sys.stderr)
  evals, clients = trainer.evaluator.evaluate_state(state)
  print(json.dumps({'step': step, **{f'eval_{k}': v for k, v in evals.items()},
                    **({'eval_clients': clients} if clients else {})}))


def decode(task, request) -> None:
  """Prints each prompt and its continuation, sampled from --job_log_dir's latest checkpoint
  (its params alone, or its EMA if kept; no optimizer state, no train or eval step), and the
  time to the first token on stderr."""
  import time  # pylint: disable=import-outside-toplevel
  started = time.monotonic()
  from paxlike.cli.decode_text import decoded_text, read_prompts
  from paxlike.trainer import restore
  prompts = read_prompts(FLAGS.prompts_file, FLAGS.prompt)
  directory = job_dir.existing(FLAGS.job_log_dir)
  mesh, params = restore.load_latest_params(task, directory)
  print(decoded_text(task, mesh, params, prompts, request, chat=FLAGS.chat, started=started))


def main(argv: list[str]) -> None:
  run_reporting_errors(run, argv, 'paxlike')


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


def run_cli() -> None:
  """Console-script entry point. A run that succeeds exits once its output is flushed and its
  atexit handlers have run (jax.distributed's shutdown among them), skipping the interpreter's
  teardown: about 0.3 s of module and XLA client destructors on every run (an eighth of a warm
  decode's) that free nothing the operating system does not. Every file a run writes is
  closed by then (the trainer closes its checkpoints and writers itself)."""
  try:
    app.run(main, flags_parser=parse_flags)
  except SystemExit as done:
    if done.code not in (None, 0):
      raise
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(0)


if __name__ == '__main__':
  run_cli()
