"""Which tensors of which .safetensors files a Hugging Face checkpoint directory is made of, as
transformers decides it, read from the files' headers alone:

- `model.safetensors.index.json` is the truth when present: each tensor comes from the shard its
  `weight_map` names; any other file (a stray `consolidated.safetensors`, a single-file copy
  beside the shards) is ignored. A shard the index names that is absent is refused by its name.
- else `model.safetensors` alone, beside which other files are ignored too;
- else every *.safetensors file (shards without an index) but a PEFT adapter's
  `adapter_model.safetensors`, where a tensor held by two files is refused naming both (there
  is no "last file wins").

Tensors must be float (F32, F16, BF16): a float8 or integer tensor is a quantized checkpoint,
refused in one line (paxlike reads no `quantization_config`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from safetensors import SafetensorError, safe_open

from paxlike.errors import RunFailure, UserError

INDEX = 'model.safetensors.index.json'
SINGLE = 'model.safetensors'
ADAPTER = 'adapter_model.safetensors'  # A PEFT adapter's, never the model's weights.
FLOAT = ('F32', 'F16', 'BF16', 'F64')
Header = Mapping[str, tuple[tuple[int, ...], Path]]  # HF name -> (shape, file).


def _index(directory: Path) -> dict[str, Path]:
  """Tensor name -> shard of the index file; UserError for an unreadable index or a missing
  shard (named)."""
  file = directory / INDEX
  try:
    weight_map = json.loads(file.read_text())['weight_map']
    files = {name: directory / shard for name, shard in weight_map.items()}
  except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
    raise UserError(f'{file} is not a safetensors index (no weight_map: {error})') from None
  for shard in sorted(set(files.values())):
    if not shard.is_file():
      raise UserError(f'{shard.name} is missing from {directory} ({INDEX} names it)')
  return files


def _file_header(file: Path) -> dict[str, tuple[tuple[int, ...], str]]:
  """Tensor name -> (shape, dtype) of one file; RunFailure naming a file that is not one."""
  try:
    with safe_open(file, framework='numpy') as f:
      return {name: (tuple(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype())
              for name in f.keys()}
  except (SafetensorError, OSError) as error:
    raise RunFailure(f'{file} is not a readable safetensors file ({error})') from None


def _check_float(name: str, dtype: str, file: Path) -> None:
  if dtype not in FLOAT:
    raise UserError(f'{file.name} holds {name} in {dtype}: a quantized checkpoint, which paxlike '
                    f'does not load (float tensors only: {", ".join(FLOAT)})')


def weight_files(directory: str | Path) -> list[Path]:
  """The .safetensors files the checkpoint in `directory` is made of (see the module
  docstring); UserError when there is none."""
  directory = Path(directory)
  if (directory / INDEX).is_file():
    return sorted(set(_index(directory).values()))
  if (directory / SINGLE).is_file():
    return [directory / SINGLE]
  files = sorted(f for f in directory.glob('*.safetensors') if f.name != ADAPTER)
  if not files:
    raise UserError(f'no .safetensors files in {directory}')
  return files


def read_header(directory: str | Path) -> dict[str, tuple[tuple[int, ...], Path]]:
  """Tensor name -> (shape, file) of the checkpoint in `directory`, from headers alone."""
  directory = Path(directory)
  indexed = _index(directory) if (directory / INDEX).is_file() else None
  header: dict[str, tuple[tuple[int, ...], Path]] = {}
  for file in weight_files(directory):
    for name, (shape, dtype) in _file_header(file).items():
      if indexed is not None and indexed.get(name) != file:
        continue  # The index puts it elsewhere, or leaves it out: transformers ignores it.
      if name in header:
        raise UserError(f'{name} is in both {header[name][1].name} and {file.name}, and no '
                        f'{INDEX} says which to read')
      _check_float(name, dtype, file)
      header[name] = (shape, file)
  for name, file in (indexed or {}).items():
    if name not in header:
      raise UserError(f'{file.name} does not hold {name}, which {INDEX} puts there')
  return header
