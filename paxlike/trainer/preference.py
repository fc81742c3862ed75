"""Preference tuning on the trainer: a task's `loss` (preference_loss.PreferenceLoss) as the
LossFn of an LM on pair batches, and its held-out evaluation (found through the preference
objective's record, objectives/preference.py).

A pair batch (paxlike/data/preference_data.py) holds 2P sequences [2P, T]: row 2i is pair i's
chosen sequence and row 2i + 1 its rejected one, each prompt + completion + EOS, padded; `mask`
marks the completion's targets. A sequence's log-probability is the sum of its masked targets'.
The reference model of a LoRA policy is its base with the adapters off (the same params without
the adapter leaves, through the model with lora_rank=0: no second copy of the weights, and its
log-probabilities are bitwise the base model's); a full fine-tune's is the frozen copy of the
initial params the trainer keeps in the params tree (paxlike/trainer/reference.py); a
reference-free kind (simpo, orpo) has none.
"""

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from clu import metrics as clu_metrics

from paxlike.layers import lora
from paxlike.trainer import losses, reference
from paxlike.trainer.evaluation import named_average
from paxlike.trainer.preference_loss import METRICS, PairLogps, PreferenceLoss, pair_losses, pair_metrics


def sequence_logps(logits: jax.Array, batch: losses.Batch) -> tuple[jax.Array, jax.Array]:
  """(log-probability, scored tokens) of each sequence, float32 [N] each: the sums over the
  targets `batch['mask']` marks."""
  per_target, _ = losses.per_example_loss(logits, batch)
  mask = batch['mask'].astype(jnp.float32)
  return -jnp.sum(per_target * mask, axis=-1), jnp.sum(mask, axis=-1)


def without_adapters(params: Any) -> Any:
  """`params` without the LoRA adapter leaves (the base model's params)."""
  if not isinstance(params, dict):
    return params
  return {k: without_adapters(v) for k, v in params.items()
          if not (isinstance(k, str) and k.endswith(lora.SUFFIXES))}


def _apply(model: nn.Module, params: Any, batch: losses.Batch, rng: jax.Array | None
           ) -> jax.Array:
  rngs = {} if rng is None else {'dropout': rng}
  return model.apply({'params': params}, batch['inputs'], deterministic=rng is None, rngs=rngs,
                     **losses.model_inputs(batch))


def reference_logps(model: nn.Module) -> Callable[[Any, losses.Batch], jax.Array]:
  """`ref(params, batch)`: the reference's sequence log-probabilities [N] (no gradient): the
  base of a LoRA `model` (adapters off), else the frozen copy `params` hold (reference.py)."""
  spec = lora.LoraSpec.of(model)
  if not spec.enabled:
    def ref_copy(params, batch):
      if not reference.has_copy(params):
        raise ValueError('a full fine-tune\'s DPO needs the params with their frozen copy '
                         '(reference.attach)')
      logits = _apply(model, reference.frozen(params), batch, None)
      return jax.lax.stop_gradient(sequence_logps(logits, batch)[0])
    return ref_copy
  base = spec.base(model)

  def ref(params, batch):
    logits = _apply(base, jax.lax.stop_gradient(without_adapters(params)), batch, None)
    return jax.lax.stop_gradient(sequence_logps(logits, batch)[0])
  return ref


def pair_logps(logps: jax.Array, tokens: jax.Array, ref: jax.Array | None) -> PairLogps:
  """Interleaved [2P] sequence values as a PairLogps of [P] each."""
  pairs = lambda x: x.reshape(-1, 2)
  lp, tk = pairs(logps), pairs(tokens)
  refs = (None, None) if ref is None else (pairs(ref)[:, 0], pairs(ref)[:, 1])
  return PairLogps(lp[:, 0], lp[:, 1], tk[:, 0], tk[:, 1], *refs)


def pair_values(model: nn.Module, loss: PreferenceLoss
                ) -> Callable[[Any, losses.Batch, jax.Array | None],
                              tuple[jax.Array, dict[str, jax.Array], jax.Array]]:
  """`values(params, batch, rng)` -> (loss [P], metrics {name: [P]}, valid [P]): each pair's
  loss and METRICS, and 1.0 for the pairs with both completions scored (0.0: padding)."""
  ref_logps = reference_logps(model) if loss.needs_reference else None

  def values(params, batch, rng):
    logps, tokens = sequence_logps(_apply(model, reference.policy(params), batch, rng), batch)
    ref = None if ref_logps is None else ref_logps(params, batch)
    p = pair_logps(logps, tokens, ref)
    value, reward_w, reward_l = pair_losses(loss, p)
    valid = ((p.chosen_tokens > 0) & (p.rejected_tokens > 0)).astype(jnp.float32)
    return value, pair_metrics(reward_w, reward_l, p), valid
  return values


def preference_loss_fn(model: nn.Module, loss: PreferenceLoss) -> losses.MaskedMeanLoss:
  """The LossFn of `loss` on pair batches: means over the batch's pairs (padding pairs left
  out), kept as sums so a data-parallel step divides once (losses.MaskedMeanLoss)."""
  values = pair_values(model, loss)

  def sums(params, batch, rng):
    value, metrics, valid = values(params, batch, rng)
    return (jnp.sum(jnp.where(valid > 0, value, 0.0)),
            (jnp.sum(valid), {k: jnp.sum(v * valid) for k, v in metrics.items()}))
  return losses.MaskedMeanLoss(sums)


# Eval: the same per-pair values over the held-out pairs, with clu averages; metric fields
# are identifiers, so they are renamed to METRICS' names when computed.
_FIELDS = {name.replace('/', '_'): name for name in METRICS}


PairLoss = named_average('loss', 'PairLoss', __name__)
RewardsChosen = named_average('rewards_chosen', 'RewardsChosen', __name__)
RewardsRejected = named_average('rewards_rejected', 'RewardsRejected', __name__)
RewardsMargins = named_average('rewards_margins', 'RewardsMargins', __name__)
RewardsAccuracies = named_average('rewards_accuracies', 'RewardsAccuracies', __name__)
LogpsChosen = named_average('logps_chosen', 'LogpsChosen', __name__)
LogpsRejected = named_average('logps_rejected', 'LogpsRejected', __name__)


@clu_metrics.flax.struct.dataclass
class PreferenceEvalMetrics(clu_metrics.Collection):
  loss: PairLoss
  rewards_chosen: RewardsChosen
  rewards_rejected: RewardsRejected
  rewards_margins: RewardsMargins
  rewards_accuracies: RewardsAccuracies
  logps_chosen: LogpsChosen
  logps_rejected: LogpsRejected

  def compute(self) -> dict[str, jax.Array]:
    return {_FIELDS.get(k, k): v for k, v in super().compute().items()}


def eval_step(model: nn.Module, loss: PreferenceLoss, num_groups: int = 1
              ) -> Callable[[Any, dict, jax.Array], dict]:
  """`step(alg_state, batch, groups)` as evaluation.eval_step's, on pair batches: the mean
  loss and METRICS over the held-out pairs (no per-client sums: zeros [3, num_groups])."""
  values = pair_values(model, loss)

  def step(state, batch, groups):
    del groups  # Pair data has no per-client eval (PreferenceData.client_eval is None).
    value, metrics, valid = values(state.params, batch, None)
    outputs = {'loss': value, **{k.replace('/', '_'): v for k, v in metrics.items()}}
    collection = PreferenceEvalMetrics.single_from_model_output(mask=valid > 0, **outputs)
    return {'': (collection, jnp.zeros((3, num_groups), jnp.float32))}
  return step
