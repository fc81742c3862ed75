"""A paxlike LM job's checkpoint as a Hugging Face Llama directory.

python -m paxlike.interop.hf_llama --job_log_dir=DIR --out=HF_DIR [--step=N] (its __main__)

Writes config.json and model.safetensors (LoRA adapters merged into their kernels, the EMA of
the params when the run kept one) and copies the tokenizer files the run's data used, so
transformers' `LlamaForCausalLM.from_pretrained(HF_DIR)` and `AutoTokenizer` load it, and
`train.init_from=hf:HF_DIR` starts a run from it.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np
from absl import app, flags, logging

from paxlike import registry
from paxlike.cli import config_io
from paxlike.errors import UserError
from paxlike.interop import hf_llama
from paxlike.layers import TransformerLM, lora

# Beside a tokenizer.json, the files that name its special tokens (HF checkpoint layout).
TOKENIZER_SIDECARS = ('tokenizer_config.json', 'special_tokens_map.json')


def tokenizer_files(tokenizer: str) -> list[Path]:
  """The files to copy for the data's `tokenizer` ('bytes': none; a file: it and its
  sidecars; a directory: its tokenizer files)."""
  if tokenizer == 'bytes':
    return []
  path = Path(tokenizer).expanduser()
  folder, names = (path, ('tokenizer.json', 'tokenizer.model')) if path.is_dir() else (
      path.parent, (path.name,))
  return [folder / n for n in (*names, *TOKENIZER_SIDECARS) if (folder / n).is_file()]


def export_job(job_dir: str | Path, out: str | Path, step: int | None = None) -> str:
  """Writes the HF directory `out` from `job_dir`'s checkpoint (latest, or `step`); returns a
  one-line summary. UserError for a job that is not a Llama-shaped LM or has no checkpoint."""
  from paxlike.trainer import restore  # The trainer's imports, only once a job is exported.
  job_dir, out = Path(job_dir).expanduser().absolute(), Path(out).expanduser().absolute()
  saved = job_dir / 'config.json'
  if not saved.is_file():
    raise UserError(f'--job_log_dir {job_dir} holds no config.json; train first')
  registry.import_all()
  task = config_io.build(config_io.load_file(saved, registry.trusted_modules()))
  if not isinstance(task.model, TransformerLM):
    raise UserError(f'{job_dir} trained a {type(task.model).__name__}, not a Llama-shaped LM')
  if out.exists() and any(out.iterdir()):
    raise UserError(f'--out {out} exists and is not empty')
  placed, found, state = restore.load_latest_state(task, job_dir, step, evaluator=False)
  params = jax.tree.map(np.asarray, nn.meta.unbox(restore.export_params(placed, state)))
  model = task.model
  if model.lora_rank:
    params, model = lora.merge_lora(params, model), model.clone(lora_rank=0)
  hf_llama.save_hf_checkpoint(params, model, out)
  copied = tokenizer_files(getattr(task.data, 'tokenizer', 'bytes'))
  for file in copied:
    shutil.copy(file, out / file.name)
  what = ', '.join(f.name for f in copied) or 'no tokenizer (byte-level data)'
  return f'wrote {out}: config.json, model.safetensors (step {found}), {what}'


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {" ".join(argv[1:])}')
  logging.set_verbosity(logging.WARNING)
  try:
    print(export_job(FLAGS.job_log_dir, FLAGS.out, FLAGS.step))
  except UserError as error:
    print(f'paxlike.interop.hf_llama: error: {error}', file=sys.stderr)
    sys.exit(2)


FLAGS = flags.FLAGS


def run_cli() -> None:
  """`python -m paxlike.interop.hf_llama` (flags defined here, not at import)."""
  flags.DEFINE_string('job_log_dir', None, 'The paxlike job to export.', required=True)
  flags.DEFINE_string('out', None, 'The Hugging Face directory to write.', required=True)
  flags.DEFINE_integer('step', None, 'The checkpoint step (default: the latest).')
  app.run(main)
