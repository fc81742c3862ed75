"""What `train.init_from` names, read without loading anything: the source's kind, its
directory (a PEFT adapter's base) and a job's step (`parse`). The loading is init_from.py's;
this stays apart so that job_source.py (which copies the source's files) reads the same
answer without importing the model stack."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from paxlike.errors import UserError
from paxlike.interop import peft


@dataclasses.dataclass(frozen=True)
class Source:
  """A parsed `init_from`: kind 'hf' or 'job', its directory (an adapter's base), a job's step
  (None: latest) and a PEFT adapter directory to load onto the base (None: none)."""

  spec: str
  kind: str
  path: Path
  step: int | None = None
  adapter: Path | None = None


def parse(init_from: str) -> Source:
  """'hf:DIR' | 'hf:ADAPTER' | 'hf:ADAPTER@BASE' | 'job:DIR' | 'job:DIR@STEP' -> Source;
  UserError for anything else, a DIR that is not a directory, or an adapter without a base."""
  kind, sep, rest = init_from.partition(':')
  if not sep or kind not in ('hf', 'job') or not rest:
    raise UserError(f"train.init_from={init_from!r} is not 'hf:DIR', 'job:DIR' or 'job:DIR@STEP'")
  step = None
  if kind == 'hf' and '@' in rest and not Path(rest).expanduser().is_dir():
    adapter, _, base = rest.rpartition('@')
    return _adapter_source(init_from, _directory(init_from, adapter), base)
  if kind == 'job' and '@' in rest:
    rest, _, digits = rest.rpartition('@')
    if not digits.isdigit():
      raise UserError(f'train.init_from={init_from!r}: the step after @ must be an integer')
    step = int(digits)
  path = _directory(init_from, rest)
  if kind == 'hf' and peft.is_adapter(path):
    return _adapter_source(init_from, path, None)
  return Source(init_from, kind, path, step)


def _directory(init_from: str, text: str) -> Path:
  path = Path(text).expanduser().absolute()
  if not path.is_dir():
    raise UserError(f'train.init_from={init_from!r}: {path} is not a directory')
  return path


def _adapter_source(init_from: str, adapter: Path, base: str | None) -> Source:
  """An adapter dir on `base` (None: the base its adapter_config.json names, which must be a
  local directory with a config.json); UserError saying what to pass otherwise."""
  if not peft.is_adapter(adapter):
    raise UserError(f'train.init_from={init_from!r}: {adapter} is no PEFT adapter directory '
                    f'({peft.CONFIG} and no model weights): hf:ADAPTER@BASE loads an adapter onto '
                    'BASE')
  config = peft.read_config(adapter)
  named = config.get('base_model_name_or_path')
  given = base if base is not None else named
  path = Path(given).expanduser().absolute() if isinstance(given, str) and given else None
  if path is not None and (path / 'config.json').is_file():
    return Source(init_from, 'hf', path, adapter=adapter)
  what = f'train.init_from={init_from!r}: {peft.describe(adapter, config)}'
  if base is not None:
    raise UserError(f'{what}; the base given after @, {path}, holds no config.json')
  raise UserError(f'{what}, which is not a local directory holding a config.json: pass a local '
                  f'copy of it as train.init_from=hf:{adapter}@BASE_DIR (nothing is downloaded)')
