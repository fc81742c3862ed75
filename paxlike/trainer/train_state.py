"""The train state and the pure functions that make and advance it: `init_state`, `train_step`.

Each is traced once for a task's mesh (`program.place` compiles `init_state`,
`program.compile_train_step` compiles `train_step`; `build.setup` calls both); the loop
(`loop.py`) only calls the compiled programs.
"""

import math
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from paxlike.core import partitioning
from paxlike.core.algorithm import Algorithm
from paxlike.core.trainable import TrainableMask, merge_params, split_params


class TrainState(NamedTuple):
  """What is checkpointed: the algorithm's state and the count of skipped non-finite steps."""

  alg: Any
  nonfinite_steps: jax.Array


class EmaTrainState(NamedTuple):
  """A TrainState with `train.ema_decay`: also the EMA of the trainable params. (A class of its
  own, so that runs without an EMA keep the checkpoint layout they always had.)"""

  alg: Any
  nonfinite_steps: jax.Array
  ema: Any


def ema_params(state: TrainState | EmaTrainState, trainable: TrainableMask | None = None) -> Any:
  """The EMA params of `state` to evaluate or export: the EMA's trainable leaves, the frozen
  ones (LoRA's base) from `state.alg.params`; None without an EMA."""
  if not isinstance(state, EmaTrainState):
    return None
  return merge_params(state.ema, split_params(state.alg.params, trainable)[1])


def ema_update(ema: Any, params: Any, decay: float) -> Any:
  """decay * ema + (1 - decay) * params, leaf by leaf, in the EMA's dtype."""
  return jax.tree.map(lambda e, p: (decay * e + (1.0 - decay) * p).astype(e.dtype), ema, params)


def hyperparams_of(state: Any) -> dict[str, jax.Array]:
  """keystr(path) -> value of every optimizer hyperparameter that `optax.inject_hyperparams`
  keeps in `state` (those under a `.hyperparams` field)."""
  return {jax.tree_util.keystr(path): leaf
          for path, leaf in jax.tree_util.tree_leaves_with_path(state)
          if any(getattr(key, 'name', None) == 'hyperparams' for key in path)}


def with_hyperparams(state: Any, hyperparams: dict[str, jax.Array]) -> Any:
  """`state` with the values at `hyperparams`' paths (see hyperparams_of) replaced."""
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: hyperparams.get(jax.tree_util.keystr(path), leaf), state)


FINITE = 'finite'  # The step's metric: are its loss, grad norm and whole new state finite?


def _float_leaves(tree: Any) -> list[Any]:
  return [x for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]


# At most this many bytes of leaves are stacked into one group: should XLA copy a stack instead
# of fusing it into its reduction, the copy stays small. Larger leaves are checked one by one
# (for them a kernel per leaf costs nothing next to reading them).
GROUP_BYTES = 64 << 20


def finite_groups(abstract_tree: Any) -> tuple[tuple[int, ...], ...]:
  """The floating-point leaves of `abstract_tree` (indices in flatten order) grouped by shape,
  dtype and sharding, up to GROUP_BYTES a group: each group can be stacked without moving data,
  and checked at once."""
  groups: dict[Any, list[list[int]]] = {}
  for index, leaf in enumerate(_float_leaves(abstract_tree)):
    key = (leaf.shape, jnp.dtype(leaf.dtype), getattr(leaf, 'sharding', None))
    nbytes = math.prod(leaf.shape) * jnp.dtype(leaf.dtype).itemsize
    per_group = max(1, GROUP_BYTES // max(1, nbytes))
    chunks = groups.setdefault(key, [[]])
    if len(chunks[-1]) == per_group:
      chunks.append([])
    chunks[-1].append(index)
  return tuple(tuple(chunk) for chunks in groups.values() for chunk in chunks)


def all_finite(tree: Any, groups: tuple[tuple[int, ...], ...] | None = None) -> jax.Array:
  """Whether every floating-point value in `tree` is finite. With `groups` (`finite_groups` of
  its abstract version) the leaves of a group are stacked and reduced together: a state of
  params and Adam moments then costs a handful of reductions instead of one per leaf (on CPU
  each is a kernel per device: 175 of the 537 in a small LM's step)."""
  leaves = _float_leaves(tree)
  if groups is None:
    groups = tuple((i,) for i in range(len(leaves)))
  return jnp.all(jnp.stack([jnp.isfinite(jnp.stack([leaves[i] for i in group])).all()
                            for group in groups]))


def init_params(model: nn.Module, sample: np.ndarray, rng: jax.Array) -> Any:
  """The model's (boxed) params, initialised on one row of `sample` inputs."""
  return model.init({'params': rng, 'dropout': rng}, sample[:1])['params']


def init_state(rng: jax.Array, *, algorithm: Algorithm, params_at: Callable[[jax.Array], Any],
               boxed_params: Any, param_shardings: Any, trainable: TrainableMask | None = None,
               ema: bool = False) -> TrainState:
  """The algorithm's initial state from `params_at(rng)` (PAPA's members: from their own keys),
  every subtree shaped like the params (e.g. Adam's moments), or like their `trainable` part,
  sharded like them; with `ema`, the EMA starts at the initial params."""
  alg_state = (algorithm.init(params_at(rng)) if algorithm.seeded_init is None
               else algorithm.seeded_init(params_at, rng))
  state = TrainState(alg_state, jnp.zeros((), jnp.int32))
  if ema:
    state = EmaTrainState(*state, split_params(alg_state.params, trainable)[0])
  params = nn.meta.unbox(boxed_params)
  state = partitioning.constrain_like_params(state, params, param_shardings)
  if trainable is not None:  # The optimizer state and the EMA of the trained leaves alone.
    mask = lambda _: trainable(params)
    state = partitioning.constrain_like_params(state, split_params(params, mask)[0],
                                               split_params(param_shardings, mask)[0])
  return state


def train_step(state: TrainState, batches: dict, weights: jax.Array, rng: jax.Array, *,
               algorithm: Algorithm, skip_nonfinite: bool,
               finite_groups: tuple[tuple[int, ...], ...] | None = None,
               ema_decay: float | None = None, trainable: TrainableMask | None = None
               ) -> tuple[TrainState, dict]:
  """One round of the algorithm, and its metrics with FINITE. A non-finite round is kept out of
  the state (and counted) with `skip_nonfinite`, else the host raises before saving it.
  `finite_groups`: `finite_groups(abstract state.alg)`, to check the new state in few reductions.
  With `ema_decay`, the EMA of the `trainable` params moves toward the new ones."""
  alg_state, metrics = algorithm.next(state.alg, batches, weights, rng)
  new = state._replace(alg=alg_state)
  if ema_decay is not None:
    new = new._replace(ema=ema_update(state.ema, split_params(alg_state.params, trainable)[0],
                                      ema_decay))
  finite = (all_finite(alg_state, finite_groups)
            & all_finite((metrics['loss'], metrics.get('grad_norm', 0.0))))
  if skip_nonfinite:
    new = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, state)
    new = new._replace(nonfinite_steps=state.nonfinite_steps + 1 - finite.astype(jnp.int32))
    metrics = {**metrics, 'nonfinite_steps': new.nonfinite_steps}
  # The step's scored targets (tokens, or examples), padding excluded.
  metrics = {**metrics, 'targets': jnp.sum(batches['mask'].astype(jnp.float32))}
  return new, {**metrics, FINITE: finite}
