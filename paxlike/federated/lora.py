"""Federated LoRA: a pseudo-gradient algorithm (FedAvg, FedOpt, DiLoCo) over the adapters alone.

`frozen_base(builder, loss_fn, optimizer, trainable)` builds the algorithm with params = the
`trainable` leaves (LoRA's adapters, `layers.lora.lora_mask`) and a loss that merges them with
the frozen rest (the base) before calling `loss_fn`. Its state is the algorithm's own (e.g.
`PseudoGradientState`) with `params` the whole model, base and adapters, as centralized LoRA
keeps it: checkpoints, `init_from='job:...'`, the evaluator, decoding and the HF export read
`state.params` as they always do. Everything else in the state (server optimizer moments, DP's
clip norm, DiLoCo's inner states) is the adapters' alone, and each round the clients get, train
and send back only the adapters; the base is returned unchanged, so the exporter sends it once.

Each round builds the algorithm anew around a loss `loss(adapters, batch, rng)` that closes
over that round's base (builders only make closures, so this costs nothing under jit), and the
algorithm's own code (algorithms.py) needs no change.
"""

from __future__ import annotations

from typing import Any, Callable

import optax

from paxlike.core.algorithm import Algorithm
from paxlike.core.trainable import TrainableMask, merge_params, split_params
from paxlike.core.loss import LossFn

# base params (None: none yet, for init and the algorithm's declarations) -> the algorithm over
# the adapters whose loss merges them with that base.
AdapterAlgorithm = Callable[[Any], Algorithm]


def over_base(loss_fn: LossFn, base: Any) -> LossFn:
  """`loss(trainable, batch, rng)`: `loss_fn` of the trainable leaves merged with `base`."""

  def loss(trainable: Any, batch: Any, rng: Any) -> Any:
    if base is None:
      raise RuntimeError('a frozen-base loss was called without its base (frozen_base next)')
    return loss_fn(merge_params(trainable, base), batch, rng)

  return loss


def wrap(build: AdapterAlgorithm, trainable: TrainableMask) -> Algorithm:
  """The algorithm `build` makes, as an algorithm of the whole params: its state holds the
  whole params in `params`, everything else of the trainable leaves only."""
  declared = build(None)

  def init(params: Any) -> Any:
    adapters, _ = split_params(params, trainable)
    return declared.init(adapters)._replace(params=params)

  def next(state: Any, batches: Any, weights: Any, rng: Any) -> tuple[Any, dict]:
    adapters, base = split_params(state.params, trainable)
    new, metrics = build(base).next(state._replace(params=adapters), batches, weights, rng)
    return new._replace(params=merge_params(new.params, base)), metrics

  fixed = declared.fixed_cohort
  if fixed is not None:  # Resized (for the exporter) around the same frozen base.
    fixed = fixed._replace(resized=lambda n: wrap(
        lambda base: build(base).fixed_cohort.resized(n), trainable))
  return Algorithm(init, next, fixed_cohort=fixed, aggregator=declared.aggregator)


def frozen_base(builder: Callable[[LossFn, optax.GradientTransformation], Algorithm],
                loss_fn: LossFn, optimizer: optax.GradientTransformation,
                trainable: TrainableMask) -> Algorithm:
  """`builder(loss, optimizer)` trained over the `trainable` leaves only (see the module doc).
  The builder's algorithm must keep no params besides `state.params` (no ensemble, no seeded
  members): the pseudo-gradient ones."""
  build = lambda base: builder(over_base(loss_fn, base), optimizer)
  declared = build(None)
  if declared.ensemble is not None or declared.seeded_init is not None:
    raise ValueError('frozen_base takes an algorithm whose only params are state.params')
  return wrap(build, trainable)
