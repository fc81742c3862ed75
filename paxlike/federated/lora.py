"""Federated LoRA: a pseudo-gradient algorithm (FedAvg, FedOpt, DiLoCo) over the adapters alone.

`frozen_base(builder, loss_fn, optimizer, trainable)` builds the algorithm with params = the
`trainable` leaves (LoRA's adapters, `layers.lora.lora_mask`) and a loss that merges them with
the frozen rest (the base) before calling `loss_fn`. Its state is the algorithm's own (e.g.
`PseudoGradientState`) with `params` the whole model, base and adapters, as centralized LoRA
keeps it: checkpoints, `init_from='job:...'`, the evaluator, decoding and the HF export read
`state.params` as they always do. Everything else in the state (server optimizer moments, DP's
clip norm, DiLoCo's inner states) is the adapters' alone, and each round the clients get, train
and send back only the adapters; the base is returned unchanged, so the exporter sends it once.

The loss reads the base from the round being traced (a context variable set by `next` while it
calls the algorithm), so the algorithm's own code (algorithms.py) needs no change: its loss is
`loss(adapters, batch, rng)`, closing over the base of the round it runs in.
"""

from __future__ import annotations

import contextvars
from typing import Any, Callable

import optax

from paxlike.trainer.algorithm import Algorithm
from paxlike.trainer.centralized import TrainableMask, merge_params, split_params
from paxlike.trainer.losses import LossFn

_BASE: contextvars.ContextVar[Any] = contextvars.ContextVar('frozen_base', default=None)


def over_trainable(loss_fn: LossFn) -> LossFn:
  """`loss(trainable, batch, rng)`: `loss_fn` of the trainable leaves merged with the frozen
  base of the round that `frozen_base`'s `next` is tracing."""

  def loss(trainable: Any, batch: Any, rng: Any) -> Any:
    base = _BASE.get()
    if base is None:
      raise RuntimeError('a frozen-base loss was called outside its round (frozen_base next)')
    return loss_fn(merge_params(trainable, base), batch, rng)

  return loss


def wrap(inner: Algorithm, trainable: TrainableMask) -> Algorithm:
  """`inner` (built with an `over_trainable` loss) as an algorithm of the whole params: its
  state holds the whole params in `params`, everything else of the trainable leaves only."""

  def init(params: Any) -> Any:
    adapters, _ = split_params(params, trainable)
    return inner.init(adapters)._replace(params=params)

  def next(state: Any, batches: Any, weights: Any, rng: Any) -> tuple[Any, dict]:
    adapters, base = split_params(state.params, trainable)
    token = _BASE.set(base)
    try:
      new, metrics = inner.next(state._replace(params=adapters), batches, weights, rng)
    finally:
      _BASE.reset(token)
    return new._replace(params=merge_params(new.params, base)), metrics

  fixed = inner.fixed_cohort
  if fixed is not None:  # Resized (for the exporter) with the same frozen base.
    fixed = fixed._replace(resized=lambda n: wrap(inner.fixed_cohort.resized(n), trainable))
  return Algorithm(init, next, fixed_cohort=fixed, aggregator=inner.aggregator)


def frozen_base(builder: Callable[[LossFn, optax.GradientTransformation], Algorithm],
                loss_fn: LossFn, optimizer: optax.GradientTransformation,
                trainable: TrainableMask) -> Algorithm:
  """`builder(loss, optimizer)` trained over the `trainable` leaves only (see the module doc).
  The builder's algorithm must keep no params besides `state.params` (no ensemble, no seeded
  members): the pseudo-gradient ones."""
  inner = builder(over_trainable(loss_fn), optimizer)
  if inner.ensemble is not None or inner.seeded_init is not None:
    raise ValueError('frozen_base takes an algorithm whose only params are state.params')
  return wrap(inner, trainable)
