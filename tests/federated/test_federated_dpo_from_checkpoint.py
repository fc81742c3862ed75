"""federated.DpoLoraFedAvg from a Hugging Face checkpoint (`train.init_from=hf:DIR`) takes the
checkpoint's shape and tokenizer, as lm.DpoLlama does (it kept its byte model and tokenizer, and
the import failed on a shape mismatch), and trains only the adapters: after its rounds the
base is bitwise the checkpoint's weights."""

import json
import random

import jax
import numpy as np
import pytest
from flax import traverse_util

from paxlike import interop
from paxlike.layers import TransformerLM
from tests.hf_fixtures import write_random_checkpoint
from tests.helpers import cli_env, metric_rows, run_cli
from tests.tokenizers.chat_fixtures import write_chat_tokenizer

pytestmark = pytest.mark.slow

MODEL = dict(vocab_size=384, num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, d_ff=128,
             max_len=128, tied_embeddings=False, norm_eps=1e-5)


@pytest.fixture(scope='module')
def source(tmp_path_factory):
  """An HF dir (random weights, config.json, a BPE tokenizer.json) and four clients' pairs."""
  root = tmp_path_factory.mktemp('fed_dpo_hf')
  write_random_checkpoint(TransformerLM(**MODEL), root / 'hf')
  write_chat_tokenizer(root / 'hf', None, {'eos_token': '<|im_end|>',
                                           'pad_token': '<|endoftext|>'})
  rng = random.Random(0)
  (root / 'clients').mkdir()
  for client in range(4):
    rows = []
    for i in range(30):
      word = ''.join(rng.choice('abcdefghij') for _ in range(rng.randint(3, 6)))
      rows.append(json.dumps({'prompt': f'word {i}: ', 'chosen': word, 'rejected': word.upper()}))
    (root / 'clients' / f'c{client}.jsonl').write_text('\n'.join(rows) + '\n')
  return root


def flat(tree) -> dict[str, np.ndarray]:
  return {k: np.asarray(v) for k, v in traverse_util.flatten_dict(tree, sep='/').items()}


def test_dpo_lora_fedavg_takes_the_checkpoints_shape_and_tokenizer(source, tmp_path,
                                                                   monkeypatch):
  from paxlike.cli import run_config
  from paxlike.config import config_io
  from paxlike.data import token_store
  from paxlike.trainer import restore
  job = tmp_path / 'job'
  env = cli_env(PAXLIKE_TOKEN_DIR=str(tmp_path / 'tokens'))
  run_cli('--exp=federated.DpoLoraFedAvg', f'--job_log_dir={job}',
          f'--fdl_set=train.init_from=hf:{source}/hf',
          f'--fdl_set=data.files={source}/clients/*.jsonl', '--fdl_set=data.partition=file',
          '--fdl_set=data.client_field=None', '--fdl_set=data.clients_per_round=2',
          '--fdl_set=data.local_steps=1', '--fdl_set=data.seq_len=32',
          '--fdl_set=data.batch_size=2', '--fdl_set=data.eval_batch_size=4',
          '--fdl_set=data.num_eval_batches=1', '--fdl_set=data.eval_fraction=0.1',
          '--fdl_set=train.num_steps=2', '--fdl_set=train.log_every=1',
          '--fdl_set=train.eval_every=2', '--fdl_set=train.checkpoint_every=2', env=env)
  text = (job / 'config.txt').read_text()
  for name, value in MODEL.items():
    assert f'model.{name} = {value!r}' in text
  assert f"data.tokenizer = '{job}/source/tokenizer.json'" in text
  rows = metric_rows(job)
  assert [r['step'] for r in rows] == [1, 2] and rows[-1]['clients'] == 2
  assert all(np.isfinite(r['loss']) for r in rows) and 'eval_loss' in rows[-1]
  monkeypatch.setenv(token_store.TOKEN_DIR_ENV, str(tmp_path / 'tokens'))
  task = config_io.build(run_config.run_config(str(job), None))
  _, step, state = restore.load_latest_state(task, job, evaluator=False)
  assert step == 2
  trained = flat(jax.device_get(state.alg.params))
  _, imported = interop.load_hf_checkpoint(source / 'hf')
  base = {k: v for k, v in trained.items() if '_lora_' not in k}
  assert set(base) == set(flat(imported)) and len(base) < len(trained)
  for name, value in flat(imported).items():
    assert base[name].tobytes() == value.astype(base[name].dtype).tobytes(), name
  adapters = [v for k, v in trained.items() if '_lora_b' in k]
  assert adapters and any(np.any(v) for v in adapters)  # The adapters trained.
