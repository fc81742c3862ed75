"""A paxlike LM job's checkpoint as a Hugging Face directory of its family.

python -m paxlike.interop.hf --job_log_dir=DIR --out=HF_DIR [--step=N] [--allow_import=MODULE]
(also as .hf_llama)

Writes config.json and model.safetensors (LoRA adapters merged into their kernels, the EMA of
the params when the run kept one), copies the tokenizer files the run's data used and writes
generation_config.json (the source's, else the tokenizer's eos/bos/pad: `generation_config`), so
transformers' `AutoModelForCausalLM.from_pretrained(HF_DIR)` and `AutoTokenizer` load it, and
`train.init_from=hf:HF_DIR` starts a run from it. The family is the source checkpoint's when
the job dir holds `source/config.json` (a fine-tune's copy; its keys that do not change the
computation, such as token ids, are carried over), else the first family the model matches.
The directory is written beside `--out` under a temporary name and renamed into place when
complete, so an export killed midway leaves no `--out` and a rerun starts clean.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from absl import app, flags, logging

from paxlike import registry
from paxlike.cli import flag_defs
from paxlike.config import config_io
from paxlike.core import files
from paxlike.errors import UserError
from paxlike.interop import checkpoint, hf_fields
from paxlike.layers import TransformerLM, lora, quantization
from paxlike.trainer import job_source

GENERATION_FILE = 'generation_config.json'

def export_job(job_dir: str | Path, out: str | Path, step: int | None = None,
               allow_import: tuple[str, ...] = ()) -> str:
  """Writes the HF directory `out` from `job_dir`'s checkpoint (latest, or `step`); returns a
  one-line summary. UserError for a job that is no LM of a known family or has no checkpoint.
  `allow_import`: the user's modules its saved config may name (a GRPO job's own reward
  function), as the trainer's --allow_import."""
  from paxlike.trainer import build, restore  # The trainer's, only once a job is exported.
  job_dir, out = Path(job_dir).expanduser().absolute(), Path(out).expanduser().absolute()
  saved = job_dir / 'config.json'
  if not saved.is_file():
    raise UserError(f'--job_log_dir {job_dir} holds no config.json; train first')
  registry.import_all()
  cfg = config_io.load_file(saved, [*allow_import, *registry.trusted_modules()])
  job_source.relocate(job_dir, cfg)  # A moved job dir: the tokenizer is its own copy.
  task = config_io.build(cfg)
  if not isinstance(task.model, TransformerLM):
    raise UserError(f'{job_dir} trained a {type(task.model).__name__}, not a TransformerLM')
  if out.exists() and any(out.iterdir()):
    raise UserError(f'--out {out} exists and is not empty')
  placed, found, state = restore.load_latest_state(task, job_dir, step, evaluator=False,
                                                   kept_as=build.kept_as(cfg, task))
  params = jax.tree.map(np.asarray, nn.meta.unbox(restore.export_params(placed, state)))
  model = task.model
  if model.base_quantization != 'none':  # The adapters merge into the dequantized base.
    params = quantization.dequantize_tree(params)
    model = model.clone(base_quantization='none')
  model, params = lora.LoraSpec.of(model).merged(model, params)
  source = _source_config(job_dir)
  tokenizer = job_source.tokenizer_of(task.data) or 'bytes'
  copied = job_source.tokenizer_files(tokenizer)
  generation = generation_config(job_dir, tokenizer)
  model_type = source.get('model_type')
  checkpoint.architecture_for_model(model, model_type)  # Refused before anything is written.
  carried = {k: v for k, v in source.items() if k in hf_fields.HARMLESS}
  write_atomically(out, lambda tmp: _write(tmp, params, model, model_type, carried, copied,
                                           generation))
  what = ', '.join([*(f.name for f in copied), *[GENERATION_FILE] * bool(generation)])
  what = what or 'no tokenizer (byte-level data)'
  family = json.loads((out / 'config.json').read_text())['model_type']
  return f'wrote {out}: {family} config.json, model.safetensors (step {found}), {what}'


def _source_config(job_dir: Path) -> dict[str, Any]:
  """The source checkpoint's config.json a fine-tune copied into the job dir ({} if none)."""
  file = job_dir / 'source' / 'config.json'
  return checkpoint.read_config(file.parent) if file.is_file() else {}


def generation_config(job_dir: Path, tokenizer: str) -> str | None:
  """What the export writes as generation_config.json, so that transformers' `generate` stops
  where the source stopped: the source checkpoint's own file (the job's copy, as it is), else
  JSON of the tokenizer's bos/eos/pad ids, eos with the chat template's end-of-turn token when
  it has another (what `--mode=decode --chat` stops at); None for byte-level data (no tokenizer
  is exported)."""
  source = job_dir / job_source.SOURCE_DIR / GENERATION_FILE
  if source.is_file():
    return source.read_text('utf-8')
  if tokenizer == 'bytes':
    return None
  from paxlike.tokenizers import load_tokenizer  # pylint: disable=import-outside-toplevel
  from paxlike.tokenizers.chat_encoder import ChatEncoder  # pylint: disable=import-outside-toplevel
  from paxlike.tokenizers.chat_template import load_chat_template  # pylint: disable=import-outside-toplevel
  loaded = load_tokenizer(tokenizer)
  eos: Any = loaded.eos_id
  if loaded.kind == 'hf':
    try:
      end_of_turn = ChatEncoder(loaded, load_chat_template(loaded.path)).end_of_turn_id
    except UserError:  # No chat template beside it (or one that cannot render a turn).
      end_of_turn = None
    if end_of_turn not in (None, eos):
      eos = [eos, end_of_turn]
  ids = {'bos_token_id': loaded.bos_id, 'eos_token_id': eos, 'pad_token_id': loaded.pad_id}
  config = Path(loaded.path).parent / 'tokenizer_config.json'
  named = json.loads(config.read_text('utf-8')) if config.is_file() else {}
  if isinstance(named, dict) and 'bos_token' in named and named['bos_token'] is None:
    del ids['bos_token_id']  # bos_token: null, which transformers' tokenizer reads as none.
  return json.dumps({k: v for k, v in ids.items() if v is not None}, indent=2) + '\n'


def _write(tmp: Path, params: Any, model: TransformerLM, model_type: str | None,
           carried: dict[str, Any], copied: list[Path], generation: str | None) -> None:
  checkpoint.save_hf_checkpoint(params, model, tmp, model_type=model_type, carried=carried)
  for file in copied:
    shutil.copy(file, tmp / file.name)
  if generation is not None:
    (tmp / GENERATION_FILE).write_text(generation, 'utf-8')


def write_atomically(out: Path, write: Callable[[Path], None]) -> None:
  """Runs `write(tmp)` on a fresh directory beside `out` that then replaces `out` (absent or
  empty: OSError otherwise) whole, its files fsynced (paxlike.core.files.dir_written); the
  temporary directory is removed if `write` fails."""
  with files.dir_written(out) as tmp:
    write(tmp)
    if out.is_dir() and not any(out.iterdir()):
      out.rmdir()


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  logging.set_verbosity(logging.WARNING)
  try:
    print(export_job(FLAGS.job_log_dir, FLAGS.out, FLAGS.step, tuple(FLAGS.allow_import)))
  except UserError as error:
    print(f'paxlike.interop.hf: error: {error}', file=sys.stderr)
    sys.exit(2)


FLAGS = flags.FLAGS


def run_cli() -> None:
  """`python -m paxlike.interop.hf` (and .hf_llama; flags defined here, not at import)."""
  flags.DEFINE_string('job_log_dir', None, 'The paxlike job to export.', required=True)
  flags.DEFINE_string('out', None, 'The Hugging Face directory to write.', required=True)
  flags.DEFINE_integer('step', None, 'The checkpoint step (default: the latest).')
  flags.DEFINE_multi_string('allow_import', [], "A module of the user's the job's config names "
                            '(e.g. its reward function), as when it was trained.')
  flag_defs.show_in_help('job_log_dir', 'out', 'step', 'allow_import')
  app.run(main)
