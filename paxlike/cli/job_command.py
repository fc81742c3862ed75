"""The job commands: train, eval, decode and print_config of a task config (`paxlike train`,
`paxlike eval`, ...; `python -m paxlike.main --mode=MODE`), and the experiments' list (`paxlike
list`; `--list`). Each reads the groups of shared flags it needs (FLAG_GROUPS)."""

from __future__ import annotations

import functools
import json
import sys
import time
from typing import TYPE_CHECKING

import fiddle as fdl

from paxlike import registry
from paxlike.cli import flag_defs, program
from paxlike.cli.flag_defs import FLAGS, MODES
from paxlike.config import config_io
from paxlike.errors import UserError
from paxlike.trainer import job_dir, job_source
from paxlike.trainer.task import Task

if TYPE_CHECKING:
  from paxlike.cli.decode_text import DecodeRequest


# The flag groups (flag_defs) each command reads; None: `python -m paxlike.main`, whose --mode
# and --list choose the command.
FLAG_GROUPS = {
    'train': (flag_defs.CONFIG, flag_defs.JOB),
    'eval': (flag_defs.CONFIG, flag_defs.JOB),
    'decode': (flag_defs.CONFIG, flag_defs.JOB, flag_defs.DECODE),
    'print_config': (flag_defs.CONFIG,),
    'list': (),
    None: (flag_defs.CONFIG, flag_defs.JOB, flag_defs.DECODE, flag_defs.MODE),
}


def define_flags(mode: str | None) -> None:
  """The flags of the job command `mode` (None: of all, and --mode and --list)."""
  flag_defs.define(*FLAG_GROUPS[mode])


def run(argv: list[str], mode: str | None = None) -> None:
  """Runs `mode` ('list' prints the registered experiments), else what --list and --mode ask.
  Raises UserError/RunFailure for the caller to turn into exit codes."""
  if len(argv) > 1:
    raise UserError(f'unexpected arguments: {" ".join(argv[1:])}')
  if mode == 'list' or (mode is None and FLAGS.list):
    registry.import_all()
    print(registry.listing())
    return
  mode = mode or FLAGS.mode
  if mode not in MODES:
    raise UserError(f'--mode={mode!r} is not one of {", ".join(MODES)}')
  program.use_local_settings()
  cfg = program.task_config()
  task = config_io.build(cfg)
  if mode == 'print_config':
    print_config(cfg, task)
    return
  if not FLAGS.job_log_dir:
    raise UserError(f'--job_log_dir is required for --mode={mode}')
  request = decode_request(task) if mode == 'decode' else None  # Before anything compiles.
  # Heavy imports only once a job really runs.
  from paxlike.trainer import distributed
  distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id,
                         FLAGS.distributed_init_timeout, FLAGS.heartbeat_timeout)
  if mode == 'train':
    train(cfg, task)
  elif mode == 'eval':
    evaluate(cfg, task)
  else:
    decode(task, request)


def decode_request(task: Task) -> DecodeRequest:
  """What the decode flags ask of `task`, checked: an LM, a kernel this platform has."""
  from paxlike.cli.decode_text import DecodeRequest, Sampling
  from paxlike.families import family_of
  if not family_of(task.model).can_decode:
    raise UserError('--mode=decode needs a language model experiment')
  request = DecodeRequest(FLAGS.decode_length,
                          Sampling(FLAGS.temperature, FLAGS.top_k, FLAGS.top_p), FLAGS.decode_seed)
  family_of(task.model).kernel_line(task.model, task.data)  # A forced kernel this platform lacks.
  return request


def print_config(cfg: fdl.Config, task: Task) -> None:
  """The config as text, the model's size, FLOPs and memory lines, and a DP run's budget."""
  from paxlike.cli.config_lines import model_summary
  from paxlike.families import family_of
  from paxlike.trainer import privacy
  print(config_io.to_text(cfg) + model_summary(task) + family_of(task.model).memory_summary(task),
        end='')
  accountant = privacy.accountant(task)
  if accountant is not None:
    print(accountant.describe(task.train.num_steps))


def train(cfg: fdl.Config, task: Task) -> None:
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


def evaluate(cfg: fdl.Config, task: Task) -> None:
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


def decode(task: Task, request: DecodeRequest) -> None:
  """Prints each prompt and its continuation, sampled from --job_log_dir's latest checkpoint
  (its params alone, or its EMA if kept; no optimizer state, no train or eval step), and the
  time to the first token on stderr."""
  started = time.monotonic()
  from paxlike.cli.decode_text import decoded_text, read_prompts
  from paxlike.trainer import restore
  prompts = read_prompts(FLAGS.prompts_file, FLAGS.prompt)
  directory = job_dir.existing(FLAGS.job_log_dir)
  mesh, params = restore.load_latest_params(task, directory)
  print(decoded_text(task, mesh, params, prompts, request, chat=FLAGS.chat, started=started))


def main(argv: list[str], mode: str | None = None) -> None:
  """absl's main of a job command: `run` with its errors reported as paxlike's."""
  program.run_reporting_errors(functools.partial(run, mode=mode), argv, 'paxlike')


def run_cli(mode: str | None = None) -> None:
  """The job command `mode` on sys.argv's flags (its flags defined here); None: the mode is
  --mode (`python -m paxlike.main`)."""
  define_flags(mode)
  program.run_quick_exit(functools.partial(main, mode=mode))
