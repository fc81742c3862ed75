"""Eval of packed batches keeps documents apart exactly as training does: the eval step's loss
on a packed batch equals the training loss function's, and differs from attending across."""

import collections

import jax
import numpy as np
import pytest

from paxlike.trainer import evaluation, losses
from paxlike.data import TextData
from paxlike.data.text_files import Fields
from paxlike.layers import TransformerLM


@pytest.fixture
def packed_batch(tmp_path, monkeypatch):
  monkeypatch.setenv('PAXLIKE_TOKEN_DIR', str(tmp_path / 'tokens'))
  corpus = tmp_path / 'docs.txt'
  corpus.write_text('\n'.join(f'document {i} says {"ab" * (i % 7 + 1)}' for i in range(200)))
  data = TextData(files=str(corpus), fields=Fields(txt_document='line'), seq_len=64, batch_size=2,
                  eval_batch_size=4, num_eval_batches=1, eval_fraction=0.2, num_workers=1)
  batch = data.eval_batches()[0]
  assert (batch['segment_ids'].max(axis=1) > 1).all()  # Several documents in every row.
  return {k: jax.numpy.asarray(v) for k, v in batch.items()}


def test_eval_loss_on_a_packed_batch_is_the_training_losses(packed_batch):
  model = TransformerLM(num_layers=1, d_model=32, num_heads=2, d_ff=64, max_len=64)
  # Jitted, so each compiles one program: eagerly, every op compiles on its own.
  params = jax.jit(model.init)(jax.random.key(0), packed_batch['inputs'])['params']
  params = jax.tree.map(lambda x: x * 8, jax.tree.map(np.asarray, params))  # Sharp attention.
  state = collections.namedtuple('State', 'params')(params)
  groups = np.zeros(packed_batch['mask'].shape, np.int32)
  out = jax.jit(evaluation.eval_step(model, 'tokens', 1))(state, packed_batch, groups)
  got = float(out[''][0].compute()['loss'])
  loss_fn = jax.jit(losses.model_loss_fn(model))
  want, _ = loss_fn(params, packed_batch, None)
  across, _ = loss_fn(
      params, {k: v for k, v in packed_batch.items() if k not in losses.PACKING_KEYS}, None)
  np.testing.assert_allclose(got, float(want), rtol=1e-5)
  assert abs(float(across) - float(want)) > 1e-3  # Attending across documents would differ.
