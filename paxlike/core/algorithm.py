"""The training-algorithm contract, which the trainer and every algorithm depend on.

An algorithm is an optax-style pure pair `(init, next)` (centralized training is one, and so is
every federated algorithm); `AlgorithmBuilder` is how a task names one: called with the model's
loss and the task's optimizer, it returns the pair. Also here: the error for bad algorithm
arguments, and the helpers every algorithm uses to read a round's batches.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from paxlike.core.batch import STEP_MASK
from paxlike.core.loss import LossFn
from paxlike.errors import UserError


class FixedCohort(NamedTuple):
  """What an algorithm whose state keeps one slice per cohort slot needs of the data (DiLoCo's
  replicas, PAPA's members, BTM's experts, SCAFFOLD's clients).

  `size`: the slots; the data's `clients_per_round` must equal it. `arg`: the builder argument
  that sets it (errors name `algorithm.<arg>`). `per_client`: slot i must also be client i in
  every round (data sampling 'fixed'). `resized(n)`: the same algorithm with n slots (the
  exporter traces the one-client program with it).
  """

  size: int
  arg: str
  per_client: bool
  resized: Callable[[int], 'Algorithm']


class Algorithm(NamedTuple):
  """An optax-style pure pair. `init(params) -> state`; `next(state, batches, weights, rng) ->
  (state, metrics)`, with `batches` leading `[clients, local_steps, ...]`, `weights` [clients]
  and `state.params` the model to evaluate.

  `ensemble(state) -> (stacked member params, log prior [members])`, for algorithms that keep
  an ensemble besides `state.params` (BTM's experts); the trainer evaluates both.

  `seeded_init(init_params, rng) -> state`, for algorithms that draw their own initial params
  with `init_params(key) -> params` (PAPA's members, each from its own key); the trainer calls
  it instead of `init(init_params(rng))`.

  What the algorithm needs, declared for the code that checks or reads it: `fixed_cohort`
  (None: any cohort; see FixedCohort), read by the cohort check and the exporter;
  `aggregator`, how client updates become the server's update (None: their weighted mean),
  read by the privacy accountant; and `pools_cohort`, whether some round trains the whole
  cohort's batches as one model (BTM's seed phase), read by the memory estimate: that round's
  activations are the cohort's whatever `client_chunk` says.

  What it can do: `over_trainable(mask) -> Algorithm`, the same algorithm training only the
  leaves `mask` (a `trainable.TrainableMask`) marks, the rest frozen in `state.params`: what
  the trainer runs for a LoRA model. None for an algorithm that keeps params besides
  `state.params` (members, experts, control variates), which cannot freeze them.
  """

  init: Callable[[Any], Any]
  next: Callable[[Any, Any, jax.Array, jax.Array], tuple[Any, dict[str, jax.Array]]]
  ensemble: Callable[[Any], tuple[Any, jax.Array]] | None = None
  seeded_init: Callable[[Callable[[jax.Array], Any], jax.Array], Any] | None = None
  fixed_cohort: FixedCohort | None = None
  aggregator: Any = None
  over_trainable: Callable[[Any], 'Algorithm'] | None = None
  pools_cohort: bool = False


# builder(loss_fn, optimizer) -> Algorithm: what `Task.algorithm` holds (a `fdl.Partial` of one).
AlgorithmBuilder = Callable[[LossFn, optax.GradientTransformation], Algorithm]


class AlgorithmConfigError(UserError, ValueError):
  """A bad algorithm argument or a cohort that does not fit it (a ValueError; CLI exit code 2)."""


def cast_like(tree: Any, like: Any) -> Any:
  """`tree` with each leaf cast to the dtype of the matching leaf of `like`."""
  return jax.tree.map(lambda x, ref: x.astype(ref.dtype), tree, like)


def cohort_size(batches: Any, fixed: tuple[int, str] | None = None,
                partial_steps: bool = False) -> int:
  """The number of clients (leading axis of `batches`, which lead [clients, local_steps]); with
  `fixed=(n, 'experts')`, checks that the cohort is exactly the algorithm's n members. Batches
  with a STEP_MASK (slots that run fewer than all local steps: stragglers, a Poisson cohort's
  padding) are refused unless the caller handles them (`partial_steps`)."""
  if not partial_steps and step_runs(batches) is not None:
    raise AlgorithmConfigError(
        'this algorithm runs every local step of every slot, but the data has slots that run '
        'fewer (stragglers, data.straggler_fraction > 0; or a Poisson cohort\'s padded slots): '
        'set data.straggler_fraction=0, or use FedAvg, FedOpt, FedProx or DiLoCo')
  shapes = {jnp.shape(leaf)[:2] for leaf in jax.tree.leaves(batches)}
  if len(shapes) != 1 or len(next(iter(shapes))) != 2:
    raise AlgorithmConfigError(
        f'batches need common leading axes [clients, local_steps], got {shapes}.')
  clients, _ = shapes.pop()
  if fixed is not None and clients != fixed[0]:
    raise AlgorithmConfigError(
        f'the cohort has {clients} clients but the algorithm has {fixed[0]} {fixed[1]}; '
        f'set clients_per_round = {fixed[0]}, one fixed client per slot.')
  return clients


def step_runs(batches: Any) -> jax.Array | None:
  """bool [clients, local_steps]: which local steps each slot runs (the batches' STEP_MASK), or
  None where the batches have none (every slot runs every step)."""
  if not isinstance(batches, dict) or STEP_MASK not in batches:
    return None
  runs = batches[STEP_MASK]
  return jnp.max(runs.reshape(*runs.shape[:2], -1), axis=2) > 0


# How clients are weighted in a round's averages: the weights the data gives (each client's
# number of examples), the mask count of the client's round batches (the tokens, or for
# classifiers the examples, it trained on: what TFF and FedJAX use), or equally.
WEIGHTINGS = ('num_examples', 'num_tokens_seen', 'uniform')


def check_weighting(weighting: str) -> str:
  if weighting not in WEIGHTINGS:
    raise AlgorithmConfigError(f'weighting must be one of {WEIGHTINGS}, got {weighting!r}.')
  return weighting


def client_weights(weighting: str, batches: Any, weights: jax.Array) -> jax.Array:
  """float32 [clients]: the round's client weights under `weighting` (see WEIGHTINGS), from the
  data's `weights` (examples per client) and the round's `batches` (a 'mask' per item)."""
  if weighting == 'num_examples':
    return jnp.asarray(weights, jnp.float32)
  if weighting == 'uniform':  # Every client in the round alike; an empty (padded) slot not.
    return (jnp.asarray(weights) > 0).astype(jnp.float32)
  if not isinstance(batches, dict) or 'mask' not in batches:
    raise AlgorithmConfigError("weighting='num_tokens_seen' needs batches with a 'mask'.")
  mask = batches['mask']
  return jnp.sum(mask.reshape(mask.shape[0], -1), axis=1, dtype=jnp.float32)
