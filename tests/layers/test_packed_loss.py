"""The loss on packed batches with padding: loss and accuracy are means over the unmasked
positions only, computed here in numpy from each document's logits alone."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from paxlike.trainer import losses
from paxlike.layers import TransformerLM
from tests.layers.test_packing import pack

MODEL = TransformerLM(vocab_size=64, num_layers=1, d_model=32, num_heads=4, num_kv_heads=2,
                      d_ff=64, rope=False, max_len=32)


def _packed_batch() -> tuple[dict[str, np.ndarray], list[list[np.ndarray]]]:
  rng = np.random.default_rng(0)
  docs = [[rng.integers(1, 64, n).astype(np.int32) for n in row] for row in ([7, 6], [9], [4, 5])]
  tokens, segments, positions = pack(docs, 16)
  # Targets: the next token of the same document; the last token of each document and the
  # padding are masked.
  targets = np.roll(tokens, -1, axis=1)
  mask = ((segments == np.roll(segments, -1, axis=1)) & (segments > 0)).astype(np.float32)
  mask[:, -1] = 0
  batch = dict(inputs=tokens, targets=targets, mask=mask, segment_ids=segments,
               positions=positions)
  return batch, docs


def _numpy_loss_and_accuracy(params, docs) -> tuple[float, float]:
  """Sums over every document's own next-token predictions (the model on the document alone)."""
  total, correct, count = 0.0, 0.0, 0
  apply = jax.jit(MODEL.apply)
  for row in docs:
    for doc in row:
      logits = np.asarray(apply({'params': params}, jnp.asarray(doc)[None])[0], np.float64)
      logits, targets = logits[:-1], doc[1:]
      shifted = logits - logits.max(-1, keepdims=True)
      log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
      total -= log_probs[np.arange(len(targets)), targets].sum()
      correct += (logits.argmax(-1) == targets).sum()
      count += len(targets)
  return total / count, correct / count


def test_packed_loss_and_accuracy_are_means_over_unmasked_positions_only():
  batch, docs = _packed_batch()
  assert 0 < batch['mask'].mean() < 1
  params = nn.unbox(jax.jit(MODEL.init)(jax.random.key(0), jnp.asarray(batch['inputs'])))[
      'params']
  loss, aux = jax.jit(losses.model_loss_fn(MODEL))(params, jax.tree.map(jnp.asarray, batch), None)
  want_loss, want_accuracy = _numpy_loss_and_accuracy(params, docs)
  np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
  np.testing.assert_allclose(float(aux['accuracy']), want_accuracy, rtol=1e-6)
  # The padding and the masked positions' losses differ from the unmasked ones: a plain mean
  # over all positions (or a loss without the segment ids) would give another number.
  logits = jax.jit(MODEL.apply)({'params': params}, jnp.asarray(batch['inputs']),
                                segment_ids=jnp.asarray(batch['segment_ids']),
                                positions=jnp.asarray(batch['positions']))
  per_position, _ = jax.jit(losses.per_example_loss)(logits, batch)
  assert abs(float(per_position.mean()) - want_loss) > 1e-3


def test_a_batch_without_packing_keys_gives_the_model_only_tokens():
  batch, _ = _packed_batch()
  plain = {k: batch[k] for k in ('inputs', 'targets', 'mask')}
  assert losses.model_inputs(plain) == {}
  assert set(losses.model_inputs(batch)) == {'segment_ids', 'positions'}
