"""The train state and the pure functions that make and advance it: `init_state`, `train_step`.

Each is traced once by `trainer_setup.setup`, which compiles them for a task's mesh; the loop
(`train.py`) only calls the compiled programs.
"""

import math
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from paxlike import partitioning
from paxlike.algorithm import Algorithm


class TrainState(NamedTuple):
  """What is checkpointed: the algorithm's state and the count of skipped non-finite steps."""

  alg: Any
  nonfinite_steps: jax.Array


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
               boxed_params: Any, param_shardings: Any) -> TrainState:
  """The algorithm's initial state from `params_at(rng)` (PAPA's members: from their own keys),
  every subtree shaped like the params (e.g. Adam's moments) sharded like them."""
  alg_state = (algorithm.init(params_at(rng)) if algorithm.seeded_init is None
               else algorithm.seeded_init(params_at, rng))
  alg_state = partitioning.constrain_like_params(alg_state, nn.meta.unbox(boxed_params),
                                                 param_shardings)
  return TrainState(alg_state, jnp.zeros((), jnp.int32))


def train_step(state: TrainState, batches: dict, weights: jax.Array, rng: jax.Array, *,
               algorithm: Algorithm, skip_nonfinite: bool,
               finite_groups: tuple[tuple[int, ...], ...] | None = None
               ) -> tuple[TrainState, dict]:
  """One round of the algorithm, and its metrics with FINITE. A non-finite round is kept out of
  the state (and counted) with `skip_nonfinite`, else the host raises before saving it.
  `finite_groups`: `finite_groups(abstract state.alg)`, to check the new state in few reductions."""
  alg_state, metrics = algorithm.next(state.alg, batches, weights, rng)
  new = TrainState(alg_state, state.nonfinite_steps)
  finite = (all_finite(alg_state, finite_groups)
            & all_finite((metrics['loss'], metrics.get('grad_norm', 0.0))))
  if skip_nonfinite:
    new = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, state)
    new = new._replace(nonfinite_steps=state.nonfinite_steps + 1 - finite.astype(jnp.int32))
    metrics = {**metrics, 'nonfinite_steps': new.nonfinite_steps}
  return new, {**metrics, FINITE: finite}
