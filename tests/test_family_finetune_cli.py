"""A fine-tune of a non-Llama checkpoint through the CLI, end to end: LoRA SFT from `hf:DIR`,
the source deleted, then the export from the job dir alone writes the source's own family,
whose reimport gives the fine-tuned model's logits."""

import json
import shutil

import fiddle as fdl
import flax.linen as nn
import jax
import numpy as np
import pytest

from paxlike import registry
from paxlike.config import config_io
from paxlike.interop import load_hf_checkpoint
from paxlike.layers import lora
from paxlike.trainer import restore
from tests.helpers import cli_env, metric_rows, run_cli, run_python
from tests.interop import checkpoints

pytestmark = pytest.mark.slow


def source_dir(root, family):
  """An HF dir of `family` (transformers 5 layout, vocab 512) with a BPE tokenizer, and SFT rows."""
  cfg = checkpoints.v5(dict(checkpoints.CASES[family], vocab_size=512))
  hf = checkpoints.write(root / 'hf', checkpoints.random_tensors(cfg), cfg)
  with open(root / 'sft.jsonl', 'w') as f:
    for i in range(200):
      f.write(json.dumps({'prompt': f'Q: {i} plus {i}?\nA:', 'completion': f' {2 * i}'}) + '\n')
  made = run_python(['-m', 'paxlike.tokenizers', 'train', f'--files={root}/sft.jsonl',
                     '--text_field=prompt', '--vocab_size=400', '--kind=bpe', f'--out={hf}',
                     '--overwrite'], cli_env(), timeout=300)
  assert made.returncode == 0, made.stderr[-2000:]
  return hf


ARCHITECTURES = {'qwen2': 'Qwen2ForCausalLM', 'gemma2': 'Gemma2ForCausalLM'}


@pytest.mark.parametrize('family', list(ARCHITECTURES))
def test_a_fine_tune_exports_as_its_source_family(tmp_path, family):
  hf = source_dir(tmp_path, family)
  source = json.loads((hf / 'config.json').read_text())
  job, out = tmp_path / 'job', tmp_path / 'exported'
  env = cli_env(PAXLIKE_TOKEN_DIR=str(tmp_path / 'tokens'))
  run_cli('--exp=lm.SftLlama', f'--job_log_dir={job}', f'--fdl_set=train.init_from=hf:{hf}',
          f'--fdl_set=data.files={tmp_path}/sft.jsonl', '--fdl_set=data.seq_len=32',
          '--fdl_set=data.batch_size=4', '--fdl_set=data.eval_batch_size=4',
          '--fdl_set=data.num_eval_batches=1', '--fdl_set=train.num_steps=3',
          '--fdl_set=train.log_every=3', '--fdl_set=optimizer.learning_rate.peak_value=0.05',
          env=env)
  assert [r['step'] for r in metric_rows(job)] == [3]
  shutil.rmtree(hf)
  proc = run_python(['-m', 'paxlike.interop.hf', f'--job_log_dir={job}', f'--out={out}'], env,
                    timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  written = json.loads((out / 'config.json').read_text())
  assert written['model_type'] == family and written['architectures'] == [ARCHITECTURES[family]]
  assert written['bos_token_id'] == source['bos_token_id']  # Carried over from the source.
  registry.import_all()
  task = config_io.build(config_io.load_file(job / 'config.json'))
  placed, step, state = restore.load_latest_state(task, job, evaluator=False)
  params = jax.tree.map(np.asarray, nn.meta.unbox(restore.export_params(placed, state)))
  assert step == 3 and any(np.abs(leaf).max() > 0 for leaf, is_adapter in zip(
      jax.tree.leaves(params), jax.tree.leaves(lora.lora_mask(params))) if is_adapter)
  tokens = checkpoints.tokens({'vocab_size': 400})
  want = task.model.apply({'params': params}, tokens)
  cfg, imported = load_hf_checkpoint(out)
  got = fdl.build(cfg).apply({'params': imported}, tokens)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=2e-5)
