"""`lm.SftLlama` from a Hugging Face-layout checkpoint through the CLI: the model's shape and the
tokenizer come from the checkpoint's directory, the source is recorded, and a resumed run
whose source is gone continues from its own checkpoints."""

import json
import shutil

import flax.linen as nn
import jax
import numpy as np
import pytest

from paxlike import interop
from paxlike.layers import TransformerLM
from tests.hf_fixtures import write_random_checkpoint
from tests.helpers import cli_env, metric_rows, run_cli, run_python

pytestmark = pytest.mark.slow

MODEL = dict(vocab_size=512, num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, d_ff=128,
             max_len=128, tied_embeddings=False, norm_eps=1e-5)


@pytest.fixture(scope='module')
def source(tmp_path_factory):
  """An HF dir (random weights, config.json, a BPE tokenizer.json) and SFT JSONL rows."""
  root = tmp_path_factory.mktemp('sft')
  write_random_checkpoint(TransformerLM(**MODEL), root / 'hf')
  with open(root / 'sft.jsonl', 'w') as f:
    for i in range(300):
      f.write(json.dumps({'prompt': f'Q: {i} plus {i}?\nA:', 'completion': f' {2 * i}'}) + '\n')
  made = run_python(['-m', 'paxlike.tokenizers', 'train', f'--files={root}/sft.jsonl',
                     '--text_field=prompt', '--vocab_size=400', '--kind=bpe',
                     f'--out={root / "hf"}', '--overwrite'], cli_env(), timeout=300)
  assert made.returncode == 0, made.stderr[-2000:]
  return root


def sft_args(root, job, steps):
  return ['--exp=lm.SftLlama', f'--job_log_dir={job}', f'--fdl_set=train.init_from=hf:{root}/hf',
          f'--fdl_set=data.files={root}/sft.jsonl', '--fdl_set=data.seq_len=64',
          '--fdl_set=data.batch_size=4', '--fdl_set=data.eval_batch_size=4',
          '--fdl_set=data.eval_fraction=0.1', '--fdl_set=data.num_eval_batches=1',
          f'--fdl_set=train.num_steps={steps}', '--fdl_set=train.log_every=2',
          '--fdl_set=train.checkpoint_every=2', '--fdl_set=train.eval_every=2']


def test_sft_takes_the_checkpoints_shape_and_tokenizer_and_outlives_its_source(source, tmp_path):
  """The job copies what it needs of its source at step 0; with the source deleted, resume,
  decode and export take only --job_log_dir (the README's commands after the first)."""
  root = tmp_path / 'src'
  shutil.copytree(source, root)
  job = tmp_path / 'job'
  env = cli_env(PAXLIKE_TOKEN_DIR=str(tmp_path / 'tokens'))
  run_cli(*sft_args(root, job, 4), env=env)
  text = (job / 'config.txt').read_text()
  for name, value in MODEL.items():
    assert f'model.{name} = {value!r}' in text
  assert f"data.tokenizer = '{job}/source/tokenizer.json'" in text
  for name in ('tokenizer.json', 'config.json'):
    assert (job / 'source' / name).read_bytes() == (root / 'hf' / name).read_bytes()
  record = json.loads((job / 'init_source.json').read_text())
  assert record['kind'] == 'hf' and set(record['files']) >= {'model.safetensors', 'config.json'}
  shutil.rmtree(root / 'hf')  # Weights, config and tokenizer: the source is gone.
  run_cli(f'--job_log_dir={job}', '--fdl_set=train.num_steps=6', env=env)
  assert [r['step'] for r in metric_rows(job)] == [2, 4, 6]
  decoded = run_cli(f'--job_log_dir={job}', '--mode=decode', '--prompt=Q: 3 plus 3?',
                    '--decode_length=4', '--temperature=0', env=env)
  assert decoded.stdout.startswith('Q: 3 plus 3?'), decoded.stdout
  out = tmp_path / 'hf_out'
  exported = run_python(['-m', 'paxlike.interop.hf', f'--job_log_dir={job}',
                         f'--out={out}'], env, timeout=300)
  assert exported.returncode == 0, exported.stderr[-2000:]
  assert (out / 'tokenizer.json').read_bytes() == (job / 'source' / 'tokenizer.json').read_bytes()


def test_a_source_of_another_shape_is_one_line_exit_2_and_writes_nothing(source, tmp_path):
  job = tmp_path / 'job'
  proc = run_cli(*sft_args(source, job, 2), '--fdl_set=model.d_ff=96', check=False,
                 env=cli_env(PAXLIKE_TOKEN_DIR=str(tmp_path / 'tokens')))
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1] == (
      'paxlike: error: model.layers.0.mlp.gate_proj.weight is [128, 64] in the checkpoint but '
      'the model needs [96, 64] (paxlike block_0/mlp/wi_gate/kernel)')
  assert not job.exists()  # Not even the empty job dir or checkpoints/ the start had made.
  job.mkdir()
  (job / 'notes.txt').write_text('mine')  # A job dir the user made is left, with its files.
  run_cli(*sft_args(source, job, 2), '--fdl_set=model.d_ff=96', check=False,
          env=cli_env(PAXLIKE_TOKEN_DIR=str(tmp_path / 'tokens')))
  assert sorted(p.name for p in job.iterdir()) == ['notes.txt']


def test_sft_without_a_source_says_what_it_needs(tmp_path):
  proc = run_cli('--exp=lm.SftLlama', f'--job_log_dir={tmp_path}', check=False)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [
      'paxlike: error: lm.SftLlama needs --fdl_set=train.init_from=... (see its docstring: --list)']


def test_export_merges_lora_and_reimports_to_identical_logits(source, tmp_path):
  from paxlike import registry
  from paxlike.config import config_io
  from paxlike.trainer import restore
  from paxlike.layers import lora
  job, out = tmp_path / 'job', tmp_path / 'exported'
  run_cli(*sft_args(source, job, 4), '--fdl_set=optimizer.learning_rate=0.05',
          env=cli_env(PAXLIKE_TOKEN_DIR=str(tmp_path / 'tokens')))
  proc = run_python(['-m', 'paxlike.interop.hf', f'--job_log_dir={job}', f'--out={out}'],
                    cli_env(), timeout=300)
  assert proc.returncode == 0 and proc.stdout.startswith(f'wrote {out}'), proc.stderr[-2000:]
  assert {p.name for p in out.iterdir()} >= {'config.json', 'model.safetensors', 'tokenizer.json'}
  registry.import_all()
  task = config_io.build(config_io.load_file(job / 'config.json'))
  placed, step, state = restore.load_latest_state(task, job)
  params = jax.tree.map(np.asarray, nn.meta.unbox(restore.export_params(placed, state)))
  adapters = [x for x, is_adapter in zip(jax.tree.leaves(params),
                                         jax.tree.leaves(lora.lora_mask(params))) if is_adapter]
  assert step == 4 and any(np.abs(a).max() > 0 for a in adapters)  # Trained adapters: B != 0.
  tokens = np.arange(1, 33, dtype=np.int32).reshape(2, 16)
  want = task.model.apply({'params': params}, tokens)
  cfg, imported = interop.load_hf_checkpoint(out)
  got = TransformerLM(**{**cfg.__arguments__}).apply({'params': imported}, tokens)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)
  # The export's old name, kept for DESIGN.md's command contract, runs the same command.
  again = run_python(['-m', 'paxlike.interop.hf_llama', f'--job_log_dir={job}', f'--out={out}'],
                     cli_env(), timeout=300)
  assert again.returncode == 2 and 'exists and is not empty' in again.stderr
