"""One train step of a tiny Llama on the TPU (splash attention, XLA:TPU) against the same step on
the host's CPU (XLA attention), from the same params and batch: the loss and the updated params
agree within the tolerance of the TPU's default (bf16-pass) matmul precision."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from paxlike.layers import TransformerLM
from paxlike.trainer import losses
from paxlike.trainer.centralized import centralized

pytestmark = pytest.mark.tpu

SHAPE = dict(vocab_size=256, num_layers=2, d_model=128, num_heads=4, num_kv_heads=2, d_ff=384,
             max_len=256, tied_embeddings=False, use_rmsnorm=True, gated_mlp=True, rope=True)
BATCH, SEQ, LR = 4, 256, 0.5


def _step(model, device, params, batch):
  """(loss, new params) of one SGD step of paxlike's centralized algorithm on `device`."""
  alg = centralized(losses.model_loss_fn(model), optax.sgd(LR))
  params, batch = jax.device_put((params, batch), device)
  state, metrics = jax.jit(alg.next)(alg.init(params), batch, jax.device_put(jnp.ones(1), device),
                                     jax.device_put(jax.random.key(0), device))
  return float(metrics['loss']), jax.device_get(state.params)


def test_a_train_step_on_tpu_matches_the_cpu_step():
  tpu, cpu = jax.devices('tpu')[0], jax.devices('cpu')[0]
  on_tpu = TransformerLM(**SHAPE)  # attention_impl 'auto': splash at seq 256 on a TPU.
  on_cpu = TransformerLM(**SHAPE, attention_impl='xla')
  assert on_tpu.attention_kernel(SEQ) == 'splash'
  tokens = np.random.default_rng(0).integers(0, 256, (1, 1, BATCH, SEQ + 1)).astype(np.int32)
  batch = {'inputs': tokens[..., :-1], 'targets': tokens[..., 1:],
           'mask': np.ones((1, 1, BATCH, SEQ), np.float32)}
  with jax.default_device(cpu):
    params = jax.device_get(nn.meta.unbox(
        on_cpu.init(jax.random.key(0), jnp.asarray(tokens[0, 0, :1, :-1]))['params']))
  loss_tpu, new_tpu = _step(on_tpu, tpu, params, batch)
  loss_cpu, new_cpu = _step(on_cpu, cpu, params, batch)
  assert loss_tpu == pytest.approx(loss_cpu, rel=1e-2)
  # The step moved the params (so comparing them says something), and both moved them alike.
  moved = jax.tree.map(lambda new, old: np.asarray(new) - np.asarray(old), new_cpu, params)
  moved_tpu = jax.tree.map(lambda new, old: np.asarray(new) - np.asarray(old), new_tpu, params)
  for path, want in jax.tree_util.tree_leaves_with_path(moved):
    got = dict(jax.tree_util.tree_leaves_with_path(moved_tpu))[path]
    assert np.linalg.norm(want) > 0, f'{jax.tree_util.keystr(path)} did not move'
    error = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert error < 5e-2, f'{jax.tree_util.keystr(path)}: update differs by {error:.4f}'
