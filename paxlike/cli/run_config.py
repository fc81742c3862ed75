"""The task config a command runs: the job dir's own, else the experiment's, then the flags.

A job dir that holds a `config.json` is the unit every later command works on: resume, eval,
decode and export start from that saved config, and the fiddlers and `--fdl_set` overrides given
now apply on top of it (a change to the model or the data is still refused by the trainer unless
`--allow_config_change`). `--exp`, when given beside such a job dir, is a check: it must name the
experiment the job was started from.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Callable, Iterable, Sequence

import fiddle as fdl

from paxlike import registry
from paxlike.config import allow_list, config_io, names
from paxlike.errors import UserError
from paxlike.trainer import job_dir, job_source, rewards

FIDDLER_PACKAGES = ('paxlike.configs',)


def fiddler_named(name: str, allow_import: Iterable[str] = ()) -> Callable[[fdl.Buildable], None]:
  """A fiddler: a function of paxlike.configs.fiddlers (a bare name), of `paxlike.configs` (also
  by its name from before it moved under paxlike, `configs.fiddlers.tiny`), or of a module the
  user allowed (`--allow_import`), named `module.function`."""
  def refusal(fn: object) -> str | None:
    return allow_list.refusal(fn, allow_import) or (
        None if inspect.isfunction(fn) else 'it is not a function')
  return names.resolve(name, 'fiddler', (*FIDDLER_PACKAGES, *allow_import), refusal,
                       default_module='paxlike.configs.fiddlers',
                       moved=allow_list.moved_module)


def experiment_config(exp: str) -> fdl.Config:
  """The registered experiment `exp`'s task config, its key recorded in `experiment`; a
  UserError (not a traceback) when the experiment's `config()` fails or returns no task config."""
  registry.import_all()
  cls = registry.get(exp)
  key = registry.key_of(cls)
  try:
    cfg = cls().config()
  except UserError:
    raise
  except Exception as error:  # The user's own experiment code: name it, one line.
    raise UserError(f'experiment {key}: building its config failed: '
                    f'{type(error).__name__}: {error}') from None
  if not isinstance(cfg, fdl.Config) or not hasattr(cfg, 'train'):
    raise UserError(f'experiment {key}: task() must return a fdl.Config of '
                    f'paxlike.experiment.Task, got {type(cfg).__name__}')
  cfg.experiment = key
  return cfg


def saved_config_file(job_log_dir: str | None) -> Path | None:
  """`job_log_dir`/config.json when the job dir has one."""
  if not job_log_dir:
    return None
  path = Path(job_log_dir).expanduser().absolute() / 'config.json'
  return path if path.is_file() else None


def _base(job_log_dir: str | None, exp: str | None, fdl_config: str | None,
          allow_import: Sequence[str], allow_change: bool) -> tuple[fdl.Config, bool]:
  """(the config before fiddlers and overrides, whether it is the job dir's saved one)."""
  if fdl_config:
    return config_io.load_file(fdl_config, allow_import), False
  saved = saved_config_file(job_log_dir)
  if saved is None:
    if exp is None:
      where = f'--job_log_dir {job_log_dir} holds no config.json (train first), so ' if (
          job_log_dir) else ''
      raise UserError(f'{where}--exp is required (or --fdl_config); use --list to see the '
                      'experiments')
    return experiment_config(exp), False
  if exp is not None:  # Imported first: the saved config may name the experiment's module.
    registry.import_all()
    registry.get(exp)
  try:
    cfg = config_io.from_json(job_dir.saved_text(saved), str(saved),
                              [*allow_import, *registry.trusted_modules()])
  except config_io.StaleConfig:
    if exp is None:
      raise
    return experiment_config(exp), False  # The trainer refuses it unless allowed.
  if exp is None:
    return cfg, True
  key, was = registry.key_of(registry.get(exp)), getattr(cfg, 'experiment', None)
  if was and key != was:
    if allow_change:
      return experiment_config(exp), False
    raise UserError(f'{saved.parent} holds a run of {was}, not {key}; drop --exp to continue '
                    'it, use another --job_log_dir, or pass --allow_config_change')
  return cfg, True


def run_config(job_log_dir: str | None, exp: str | None, fdl_config: str | None = None,
               fiddlers: Sequence[str] = (), overrides: Sequence[str] = (),
               allow_import: Sequence[str] = (), allow_change: bool = False,
               fill_from_source: Callable[[fdl.Config], None] | None = None) -> fdl.Config:
  """The config to run (see the module docstring), then `fiddlers`, then `overrides`.

  `fill_from_source(cfg)` completes a new run's config from its `train.init_from` (a job dir's
  saved config is complete already)."""
  cfg, saved = _base(job_log_dir, exp, fdl_config, allow_import, allow_change)
  for name in fiddlers:
    fiddler_named(name, allow_import)(cfg)
  config_io.apply_overrides(cfg, overrides)
  rewards.resolve_in_config(cfg, allow_import)  # GRPO reward functions named by the flags.
  if saved:
    job_source.relocate(Path(job_log_dir), cfg)  # A moved job dir: its own copy.
    job_source.same_as_copy(Path(job_log_dir).expanduser(), cfg)
  if not saved and fill_from_source is not None:
    fill_from_source(cfg)
  if not saved and not fdl_config:
    check_required(cfg, exp, getattr(registry.get(exp), 'REQUIRED', ()))
  return cfg


def check_required(cfg: fdl.Config, exp: str, required: tuple[str, ...]) -> None:
  """UserError naming the first of an experiment's REQUIRED fields that is unset or empty."""
  for path in required:
    value = cfg
    for part in path.split('.'):
      value = getattr(value, part, None)
    if value in (None, '', ()):
      raise UserError(f'{exp} needs --fdl_set={path}=... (see its docstring: --list)')
