"""One pseudo-gradient builder for FedAvg, FedOpt and DiLoCo (the client loop is clients.py).

A round, written with the federated primitives: broadcast the server params → every client runs
H local optimizer steps (`lax.scan` over the local-steps axis) → weighted mean of the client
params → the server optimizer steps along the pseudo-gradient `params - weighted_mean(client)`.

- FedAvg (McMahan et al. 2017): server `optax.sgd(1.0)`, so the new params are the weighted mean.
- FedOpt (Reddi et al. 2021): any server optimizer; `fed_adam`, `fed_yogi`, `fed_adagrad` with
  the paper's exact update (server_optim.py) or optax's.
- DiLoCo (Douillard et al. 2023): inner AdamW, outer Nesterov SGD, and each replica's inner
  optimizer state persists across rounds, client-placed (leading axis = replicas) in the state.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import optax

from paxlike.core import optim
from paxlike.core.algorithm import (Algorithm, AlgorithmConfigError, FixedCohort, cast_like,
                                    client_weights, cohort_size)
from paxlike.core.loss import LossFn
from paxlike.federated import lora, server_optim, stragglers
from paxlike.federated.chunking import resolve_client_chunk
from paxlike.federated.clients import (client_update, cohort_metrics, fresh_client_update,
                                       placed_init)
from paxlike.federated.options import RoundOptions, round_options
from paxlike.federated.primitives import (federated_broadcast, federated_map, federated_program,
                                          federated_sum, federated_weighted_mean)

class PseudoGradientState(NamedTuple):
  """Server params and server optimizer state; `client_opt_state` is DiLoCo's persistent inner
  state with leading axis `num_replicas` (an empty `optax.EmptyState()` for FedAvg/FedOpt);
  `aggregator_state` is the aggregator's (e.g. DP's clip norm; empty without one)."""

  params: Any
  server_opt_state: optax.OptState
  client_opt_state: Any
  aggregator_state: Any = optax.EmptyState()


class Aggregator(Protocol):
  """Turns client-placed updates (server params − client params) into the pseudo-gradient,
  e.g. `paxlike.federated.dp.DpAggregator`; its state is carried in the algorithm state."""

  def init(self, params: Any) -> Any: ...

  def aggregate(self, state: Any, deltas: Any, weights: jax.Array, rng: jax.Array,
                masked: bool = False) -> tuple[Any, Any, dict[str, jax.Array]]:
    """`masked`: a slot of weight 0 (padding, a dropped straggler) takes no part."""


def aggregate(aggregator: Aggregator | None, state: PseudoGradientState, start: Any,
              client_params: Any, weights: jax.Array, rng: jax.Array, masked: bool = False
              ) -> tuple[Any, Any, dict[str, jax.Array]]:
  """(pseudo-gradient, aggregator state, metrics) of a round, inside its federated program:
  the server params minus the clients' weighted mean, or what `aggregator` makes of the
  client updates `start - client_params`. `masked` (the batches have a STEP_MASK): a slot of
  weight 0 is not in the aggregate (a padded slot, a dropped straggler), and a round without
  any client has pseudo-gradient 0 (not 0/0)."""
  if aggregator is None:
    mean = (stragglers.guarded_mean(client_params, weights, state.params)[0] if masked
            else federated_weighted_mean(client_params, weights))
    pseudo_grad = jax.tree.map(lambda p, m: (p - m).astype(p.dtype), state.params, mean)
    return pseudo_grad, state.aggregator_state, {}
  deltas = jax.tree.map(jnp.subtract, start, client_params)
  pseudo_grad, aggregator_state, metrics = aggregator.aggregate(
      state.aggregator_state, deltas, weights, rng, masked=masked)
  return cast_like(pseudo_grad, state.params), aggregator_state, metrics


def server_metrics(server_opt_state: Any) -> dict[str, jax.Array]:
  """`server_learning_rate` where the server optimizer's rate is readable."""
  server_lr = optim.learning_rate_of(server_opt_state)
  return {} if server_lr is None else {'server_learning_rate': server_lr}


def server_step(server_optimizer: optax.GradientTransformation, state: PseudoGradientState,
                pseudo_grad: Any, skip: jax.Array | None = None) -> tuple[Any, Any]:
  """(params, server optimizer state) after the server optimizer's step along `pseudo_grad`;
  both as they were where `skip` (a round whose aggregate holds no client)."""
  updates, server_opt_state = server_optimizer.update(
      pseudo_grad, state.server_opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  if skip is None:
    return params, server_opt_state
  return stragglers.keep_if(skip, (state.params, state.server_opt_state),
                            (params, server_opt_state))


def pseudo_gradient(loss_fn: LossFn, client_optimizer: optax.GradientTransformation,
                    server_optimizer: optax.GradientTransformation,
                    num_replicas: int | None = None, client_chunk: int | None = None,
                    weighting: str = 'num_examples', aggregator: Aggregator | None = None,
                    prox_mu: float = 0.0, drop_stragglers: bool | None = None) -> Algorithm:
  """The FedAvg/FedOpt/DiLoCo round; each client runs one local step per entry of the batches'
  local-steps axis. With `num_replicas`, the client optimizer states are kept
  across rounds (replica i always takes cohort slot i); without, every round starts them fresh.
  `client_chunk`: clients trained at a time (`federated_map(chunk=)`; >= the cohort: all at
  once; None: chosen per platform, see chunking.py).
  `weighting`: how clients are weighted in the mean (paxlike.core.algorithm.WEIGHTINGS).
  `aggregator`: how client updates become the pseudo-gradient (None: their weighted mean; a
  `dp.DpAggregator`: clipped, noised). `prox_mu`: FedProx's proximal weight (0: none).
  `drop_stragglers`: weight 0 for a straggler's partial work (None: unless prox_mu > 0)."""
  return pseudo_gradient_round(
      loss_fn, client_optimizer, server_optimizer, num_replicas,
      round_options(client_chunk, weighting, aggregator, prox_mu, drop_stragglers))


def pseudo_gradient_round(loss_fn: LossFn, client_optimizer: optax.GradientTransformation,
                          server_optimizer: optax.GradientTransformation,
                          num_replicas: int | None, options: RoundOptions) -> Algorithm:
  """`pseudo_gradient` with its round options as one record. Its state keeps no params besides
  `state.params`, so it declares that it trains a part of them as well (`over_trainable`:
  federated LoRA, lora.frozen_base)."""
  update = client_update(loss_fn, client_optimizer, options.prox_mu)
  fresh = fresh_client_update(update, client_optimizer)
  weighting, aggregator = options.weighting, options.aggregator

  def init(params):
    server_opt_state = server_optimizer.init(params)
    kept = optax.EmptyState() if aggregator is None else aggregator.init(params)
    if num_replicas is None:
      return PseudoGradientState(params, server_opt_state, optax.EmptyState(), kept)
    _, client_opt_state = placed_init(client_optimizer, num_replicas)(params)
    return PseudoGradientState(params, server_opt_state, client_opt_state, kept)

  def next(state, batches, weights, rng):
    clients = cohort_size(batches, None if num_replicas is None else (num_replicas, 'replicas'),
                          partial_steps=True)
    weights = client_weights(weighting, batches, weights)
    present, kept_weights, straggled = stragglers.round_weights(batches, weights,
                                                                options.drops_stragglers)

    @federated_program(clients=clients)
    def round_(state, batches, weights, rng):
      start = federated_broadcast(state.params)
      keys = jax.random.split(rng, clients)
      chunk = resolve_client_chunk(options.client_chunk)
      if num_replicas is None:  # Each client's optimizer starts fresh and ends with the round.
        client_params, client_lr, stats = federated_map(fresh, (start, batches, keys), chunk)
      else:
        client_params, opt_state, stats = federated_map(
            update, (start, state.client_opt_state, batches, keys), chunk)
        client_lr = optim.learning_rate_of(opt_state)
      pseudo_grad, aggregator_state, aggregator_metrics = aggregate(
          aggregator, state, start, client_params, kept_weights, rng, present is not None)
      params, server_opt_state = server_step(
          server_optimizer, state, pseudo_grad, None if present is None or aggregator
          else federated_sum(kept_weights) == 0)
      metrics = {**cohort_metrics(stats, weights, pseudo_grad, client_lr, clients, present),
                 **stragglers.counts(present, straggled), **aggregator_metrics,
                 **server_metrics(server_opt_state)}
      kept = state.client_opt_state if num_replicas is None else opt_state
      return PseudoGradientState(params, server_opt_state, kept, aggregator_state), metrics

    return round_(state, batches, weights, rng)

  build = lambda loss, replicas: pseudo_gradient_round(loss, client_optimizer, server_optimizer,
                                                       replicas, options)
  fixed = None if num_replicas is None else FixedCohort(
      num_replicas, 'num_replicas', False, lambda n: build(loss_fn, n))
  return Algorithm(init, next, fixed_cohort=fixed, aggregator=aggregator,
                   over_trainable=lambda trainable: lora.frozen_base(
                       lambda loss, _: build(loss, num_replicas), loss_fn, client_optimizer,
                       trainable))


def fed_avg(loss_fn: LossFn, client_optimizer: optax.GradientTransformation,
            server_optimizer: optax.GradientTransformation = optax.sgd(1.0),
            client_chunk: int | None = None, weighting: str = 'num_examples',
            aggregator: Aggregator | None = None, prox_mu: float = 0.0,
            drop_stragglers: bool | None = None) -> Algorithm:
  """FedAvg, and FedOpt (Reddi et al. 2021) with any other `server_optimizer`: a fresh client
  optimizer each round, then the server optimizer on the pseudo-gradient (SGD at lr 1, the
  default, is plain weighted averaging of the client models). DP-FedAvg with
  `aggregator=DpAggregator(...)`, FedProx with `prox_mu` > 0; `drop_stragglers` as for
  `pseudo_gradient`."""
  return pseudo_gradient_round(
      loss_fn, client_optimizer, server_optimizer, None,
      round_options(client_chunk, weighting, aggregator, prox_mu, drop_stragglers))


FLAVOURS = ('paper', 'optax')


def adaptive_server(flavour: str, paper: optax.GradientTransformation,
                    optax_flavour: optax.GradientTransformation) -> optax.GradientTransformation:
  """The paper-exact server optimizer or optax's counterpart (see server_optim.py)."""
  if flavour not in FLAVOURS:
    raise AlgorithmConfigError(f'flavour must be one of {FLAVOURS}, got {flavour!r}.')
  return paper if flavour == 'paper' else optax_flavour


def fed_adam(loss_fn: LossFn, client_optimizer: optax.GradientTransformation,
             server_learning_rate: float = 1e-2, b1: float = 0.9, b2: float = 0.99,
             tau: float = 1e-3, client_chunk: int | None = None, flavour: str = 'paper',
             weighting: str = 'num_examples', aggregator: Aggregator | None = None,
             prox_mu: float = 0.0, drop_stragglers: bool | None = None) -> Algorithm:
  """FedAdam. `flavour='paper'`: Reddi et al.'s Algorithm 2 (`server_optim.adam`); `'optax'`:
  `optax.adam(eps=tau)`, which bias-corrects both moments and starts v at 0 (it agrees with the
  paper once β2ᵗ is small, after a few hundred rounds at β2 = 0.99)."""
  server = adaptive_server(flavour, server_optim.adam(server_learning_rate, b1, b2, tau),
                           optax.adam(server_learning_rate, b1=b1, b2=b2, eps=tau))
  return pseudo_gradient_round(
      loss_fn, client_optimizer, server, None,
      round_options(client_chunk, weighting, aggregator, prox_mu, drop_stragglers))


def fed_yogi(loss_fn: LossFn, client_optimizer: optax.GradientTransformation,
             server_learning_rate: float = 1e-2, b1: float = 0.9, b2: float = 0.99,
             tau: float = 1e-3, client_chunk: int | None = None, flavour: str = 'paper',
             weighting: str = 'num_examples', aggregator: Aggregator | None = None,
             prox_mu: float = 0.0, drop_stragglers: bool | None = None) -> Algorithm:
  """FedYogi. `flavour='paper'`: Algorithm 2 (`server_optim.yogi`); `'optax'`: optax's Yogi
  with eps = τ and both accumulators starting at τ², bias-corrected. `aggregator` and `prox_mu`
  as for `fed_avg`."""
  server = adaptive_server(
      flavour, server_optim.yogi(server_learning_rate, b1, b2, tau),
      optax.chain(
          optax.scale_by_yogi(b1=b1, b2=b2, eps=tau, initial_accumulator_value=tau**2),
          optax.scale_by_learning_rate(server_learning_rate)))
  return pseudo_gradient_round(
      loss_fn, client_optimizer, server, None,
      round_options(client_chunk, weighting, aggregator, prox_mu, drop_stragglers))


def fed_adagrad(loss_fn: LossFn, client_optimizer: optax.GradientTransformation,
                server_learning_rate: float = 1e-2, b1: float = 0.9,
                tau: float = 1e-3, client_chunk: int | None = None, flavour: str = 'paper',
                weighting: str = 'num_examples', aggregator: Aggregator | None = None,
                prox_mu: float = 0.0, drop_stragglers: bool | None = None) -> Algorithm:
  """FedAdagrad. `flavour='paper'`: Algorithm 2 (`server_optim.adagrad`, with server momentum
  β1); `'optax'`: `optax.adagrad` with the accumulator starting at τ² and no eps, so the step is
  Δ/√(τ² + ΣΔ²), without momentum (β1 unused). `aggregator` and `prox_mu` as for `fed_avg`."""
  server = adaptive_server(
      flavour, server_optim.adagrad(server_learning_rate, b1, tau),
      optax.adagrad(server_learning_rate, initial_accumulator_value=tau**2, eps=0.0))
  return pseudo_gradient_round(
      loss_fn, client_optimizer, server, None,
      round_options(client_chunk, weighting, aggregator, prox_mu, drop_stragglers))


def diloco(loss_fn: LossFn, inner_optimizer: optax.GradientTransformation,
           outer_optimizer: optax.GradientTransformation = optax.sgd(
               0.7, momentum=0.9, nesterov=True),
           num_replicas: int | None = None, client_chunk: int | None = None,
           weighting: str = 'num_examples', aggregator: Aggregator | None = None,
           prox_mu: float = 0.0, drop_stragglers: bool | None = None) -> Algorithm:
  """DiLoCo: H inner steps per replica (H: the batches' local steps; inner state kept across
  rounds), then the outer optimizer on the averaged pseudo-gradient. `num_replicas` is required
  and must equal the cohort size; replica i always trains on cohort slot i."""
  if num_replicas is None or num_replicas < 1:
    raise AlgorithmConfigError(
        f'diloco needs num_replicas >= 1 (the cohort size), got {num_replicas!r}.')
  return pseudo_gradient_round(
      loss_fn, inner_optimizer, outer_optimizer, num_replicas,
      round_options(client_chunk, weighting, aggregator, prox_mu, drop_stragglers))
