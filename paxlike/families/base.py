"""The contract of a model family: every question whose answer depends on the kind of model.

A `Family` is a record of functions, as optax's `GradientTransformation` is a record of `init`
and `update`: `paxlike.families.family_of(model)` returns the one for a model, and the trainer,
the evaluator, the statistics, decoding and the fiddlers ask it instead of testing the model's
class. A new kind of model is a new module here with its `FAMILY`. Questions about clients are
the data's (`DataSource.client_sizes` and `cohort`), never a family's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import jax

from paxlike.errors import UserError

if TYPE_CHECKING:  # paxlike.data imports tfds; the annotations need only these names.
  from paxlike.data.sources import Item
  from paxlike.core.loss import LossFn

# apply(params, inputs) -> logits: one model of an ensemble.
Apply = Callable[[Any, jax.Array], jax.Array]


class Family(NamedTuple):
  """The answers of one model family (`lm.FAMILY`, `classifier.FAMILY`).

  name: 'lm' or 'classifier'.
  item: what a batch's mask counts and throughput rows name: 'tokens' or 'examples'.
  can_decode: whether `--mode=decode` can sample from the model (paxlike.decode).
  complete(model, data): the model with what it takes from its data filled in (an LM's
    vocab_size=None: the data's vocabulary); building a Task calls it, then check_data.
  check_data(model, data): a one-line UserError where the model cannot train on the data
    source (wrong kind of items; an LM whose vocab_size is below the data's vocab_size).
  items_per_step(batches): the items a step trains on, from a round's batches.
  step_flops(model, loss_fn, boxed_params, batches, num_devices): model FLOPs per device of
    one step on round `batches` [clients, local_steps, batch, ...]; None where unknown.
  input_sample(data): the abstract inputs of a batch of one.
  summary(model, data): `--mode=print_config`'s lines: params, FLOPs, the attention kernel.
  kernel_line(model, data): '# attention kernel: NAME\\n' where the model has one, else ''.
  memory_summary(task): per-device memory estimate lines ('' where the family has none).
  mix_ensemble(apply, members, inputs, log_prior): the log-probs of an ensemble of stacked
    members (BTM's experts), as evaluation scores it.
  shrink(model_config): makes a model config small, in place (the `tiny` fiddler).
  """

  name: str
  item: Item
  can_decode: bool
  complete: Callable[[Any, Any], Any]
  check_data: Callable[[Any, Any], None]
  items_per_step: Callable[[Any], int]
  step_flops: Callable[[Any, LossFn, Any, dict, int], float | None]
  input_sample: Callable[[Any], jax.ShapeDtypeStruct]
  summary: Callable[[Any, Any], str]
  kernel_line: Callable[[Any, Any], str]
  memory_summary: Callable[[Any], str]
  mix_ensemble: Callable[[Apply, Any, jax.Array, jax.Array], jax.Array]
  shrink: Callable[[Any], None]


def mask_items(batches: dict) -> int:
  """The items of a round's batches: the size of their mask (tokens or examples)."""
  return int(batches['mask'].size)


def check_item(family: Family, model: Any, data: Any) -> None:
  """UserError unless `data` gives the items `family` trains on."""
  if data.item != family.item:
    raise UserError(f'model {type(model).__name__} trains on {family.item} but the data '
                    f'{type(data).__name__} gives {data.item}: pair an LM with token data and '
                    f'a classifier with example data')
