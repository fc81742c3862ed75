"""What a job needs of files outside it, copied into `DIR/source/` when it starts.

A fine-tune reads its source (`train.init_from='hf:DIR'`) for the weights at step 0 only; the
tokenizer, its chat template and the source's `config.json` are needed for as long as the job
lives (resume, eval, decode, export). So at its first start a job copies them into its own
`source/` folder and its saved config names the copies: deleting or moving the source, or the
tokenizer file a run was given, leaves the job dir whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fiddle as fdl

from paxlike.core import files as file_io
from paxlike.data.token_source import TokenizedSource
from paxlike.errors import UserError
from paxlike.trainer import init_spec

SOURCE_DIR = 'source'
# An HF checkpoint dir's files besides its weights that a job may need later.
HF_FILES = ('config.json', 'generation_config.json')
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer.model')
# Beside a tokenizer file: its special tokens and chat template (HF checkpoint layout).
TOKENIZER_SIDECARS = ('tokenizer_config.json', 'special_tokens_map.json', 'chat_template.jinja',
                      'chat_template.json')


def tokenizer_of(data: Any) -> str | None:
  """The tokenizer a data source or its config names (a TokenizedSource's `tokenizer`: 'bytes' or
  a path); None for data that reads no tokenizer."""
  cls = fdl.get_callable(data) if isinstance(data, fdl.Buildable) else type(data)
  return data.tokenizer if isinstance(cls, type) and issubclass(cls, TokenizedSource) else None


def tokenizer_files(tokenizer: str) -> list[Path]:
  """The files of the data's `tokenizer` ('bytes': none; a file: it and its sidecars; a
  directory: its tokenizer files and sidecars)."""
  if tokenizer == 'bytes':
    return []
  path = Path(tokenizer).expanduser()
  folder, names = (path, TOKENIZER_FILES) if path.is_dir() else (path.parent, (path.name,))
  return [folder / n for n in (*names, *TOKENIZER_SIDECARS) if (folder / n).is_file()]


def hf_source_dir(init_from: str | None) -> Path | None:
  """The checkpoint directory of an `'hf:...'` init source (a PEFT adapter's base for
  'hf:ADAPTER' and 'hf:ADAPTER@BASE'), else None (also when init_from cannot be read: the run
  refuses it in one line when it loads the source)."""
  if not init_from or not init_from.startswith('hf:'):
    return None
  try:
    return init_spec.parse(init_from).path  # Absolute, as parse makes every path.
  except UserError:
    return None


def _copy_into(files: list[Path], folder: Path) -> None:
  """Copies each file into `folder` under its own name, each made whole before it appears."""
  folder.mkdir(exist_ok=True)
  for file in files:
    file_io.copy_file(file, folder / file.name)


def localize(job_dir: Path, cfg: fdl.Config) -> list[str]:
  """Copies into `job_dir/source/` the tokenizer files `cfg.data.tokenizer` names and an HF
  init source's config files, and points `cfg.data.tokenizer` at the copy; returns the names
  copied. A tokenizer already inside the job dir (a resumed run) is left as it is."""
  folder = job_dir / SOURCE_DIR
  tokenizer = tokenizer_of(cfg.data)
  copied: list[Path] = []
  if isinstance(tokenizer, str) and tokenizer != 'bytes':
    path = Path(tokenizer).expanduser().absolute()
    if not path.is_relative_to(job_dir.absolute()) and path.exists():
      copied += tokenizer_files(str(path))
      cfg.data.tokenizer = str(folder if path.is_dir() else folder / path.name)
  source = hf_source_dir(cfg.train.init_from)
  if source is not None and source.is_dir():
    copied += [source / n for n in HF_FILES if (source / n).is_file()]
  unique = list({file.name: file for file in copied}.values())
  if unique:
    _copy_into(unique, folder)
  return [file.name for file in unique]


def relocate(job_dir: Path, cfg: fdl.Config) -> None:
  """Points a saved config's `data.tokenizer` at this job dir's copy when it names the copy in
  the `source/` of another directory: the job dir as it was before it was moved or copied
  (`mv run run2`; the saved config records absolute paths). Left as it is otherwise."""
  tokenizer = tokenizer_of(cfg.data)
  if not isinstance(tokenizer, str) or tokenizer == 'bytes':
    return
  path, job = Path(tokenizer), job_dir.expanduser().absolute()
  if not path.is_absolute() or path.is_relative_to(job):
    return
  if path.name == SOURCE_DIR:  # A tokenizer directory's copy: source/ itself.
    copy = job / SOURCE_DIR
  elif path.parent.name == SOURCE_DIR:
    copy = job / SOURCE_DIR / path.name
  else:
    return
  if copy.exists():
    cfg.data.tokenizer = str(copy)


def same_as_copy(job_dir: Path, cfg: fdl.Config) -> None:
  """Points `cfg.data.tokenizer` back at the job's copy when it names (again, as the command
  that started the job did) a file outside the job dir whose bytes equal the copy's: rerunning
  the first command resumes. A tokenizer that differs is left, for the trainer to refuse."""
  tokenizer = tokenizer_of(cfg.data)
  if not isinstance(tokenizer, str) or tokenizer == 'bytes':
    return
  path = Path(tokenizer).expanduser().absolute()
  copy = job_dir.absolute() / SOURCE_DIR / path.name
  if path.is_file() and copy.is_file() and path.read_bytes() == copy.read_bytes():
    cfg.data.tokenizer = str(copy)
