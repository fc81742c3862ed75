"""Differentially private aggregation of client updates (DP-FedAvg, McMahan et al. 2018), with
adaptive clipping (Andrew et al. 2021). It plugs into the pseudo-gradient builder as its
`aggregator`, so FedAvg, FedAdam and DiLoCo all get it.

A round, over the clients axis with the federated primitives:
1. each client's update Δᵢ (server params − client params) is clipped to L2 norm C over the
   whole update: Δᵢ · min(1, C / ‖Δᵢ‖);
2. the clipped updates are summed (`federated_sum`) and Gaussian noise N(0, (z_Δ C)²) is added
   once, on the server, from the round's key (reproducible and resumable);
3. the sum is divided by the expected cohort size n (client weights are ignored: each client's
   contribution is bounded by C whatever its size, which is what bounds the sensitivity).
   A slot of weight 0 is padding (a Poisson cohort's unused slot): it takes no part in the
   clipped sum, the noise or the unclipped count; n is `expected_clients` (a Poisson cohort's
   qN, which privacy.cohort_bound sets from the data where the run's algorithm is built) or,
   unset, the round's slots. A straggler the algorithm drops (weight 0, see stragglers.py) is
   left out in the same way; n is unchanged.

Adaptive clipping (`target_quantile` = γ set): the clients also report bᵢ = 1[‖Δᵢ‖ ≤ C]. The
server releases b̄ = (Σ(bᵢ − ½) + N(0, σ_b²)) / n + ½, the noised fraction of unclipped
clients, and moves the clip norm geometrically towards the γ-quantile of the update norms:
C ← C · exp(−η_C (b̄ − γ)). The two releases together are one Gaussian mechanism with noise
multiplier z = (z_Δ⁻² + (2σ_b)⁻²)^(-1/2) (the paper's Theorem 1), so `noise_multiplier` is that
z, the one the accountant sees, and the update noise z_Δ is derived from it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from paxlike.errors import UserError
from paxlike.federated.primitives import federated_map, federated_sum

ACCOUNTANTS = ('rdp', 'pld')
NOISE_STREAM = 0x6e6f6973  # fold_in tag for the server noise key ('nois').


class DpState(NamedTuple):
  """The current clip norm C (float32 scalar; fixed unless clipping is adaptive)."""

  clip_norm: jax.Array


@dataclasses.dataclass(frozen=True)
class DpAggregator:
  """Clip, sum, noise, divide: the DP aggregation, and the privacy settings it is accounted by.

  `noise_multiplier` z is relative to the clip norm under add/remove-one-client adjacency. The
  accounting fields (`delta`: default 1/population^1.1; `max_epsilon`: a run that would spend
  more is refused at start; `accountant`: 'rdp' or 'pld') are read by paxlike.trainer.privacy.
  """

  clip_norm: float = 1.0
  noise_multiplier: float = 1.0
  target_quantile: float | None = None  # γ: adaptive clipping when set.
  clip_learning_rate: float = 0.2       # η_C.
  count_stddev: float | None = None     # σ_b; default: expected cohort size / 20.
  delta: float | None = None
  max_epsilon: float | None = None
  accountant: str = 'rdp'
  expected_clients: float | None = None  # n; None: the round's slots (see the module docstring).

  def __post_init__(self):
    if not self.clip_norm > 0:
      raise UserError(f'dp clip_norm must be > 0, got {self.clip_norm!r}')
    if not self.noise_multiplier >= 0:
      raise UserError(f'dp noise_multiplier must be >= 0, got {self.noise_multiplier!r}')
    if self.delta is not None and not 0 < self.delta < 1:
      raise UserError(f'dp delta must be in (0, 1), got {self.delta!r}')
    if self.target_quantile is not None and not 0 < self.target_quantile < 1:
      raise UserError(f'dp target_quantile must be in (0, 1), got {self.target_quantile!r}')
    if self.count_stddev is not None and not self.count_stddev >= 0:
      raise UserError(f'dp count_stddev must be >= 0, got {self.count_stddev!r}')
    if self.max_epsilon is not None and not self.max_epsilon > 0:
      raise UserError(f'dp max_epsilon must be > 0, got {self.max_epsilon!r}')
    if self.expected_clients is not None and not self.expected_clients > 0:
      raise UserError(f'dp expected_clients must be > 0, got {self.expected_clients!r}')
    if self.accountant not in ACCOUNTANTS:
      raise UserError(f'dp accountant must be one of {", ".join(ACCOUNTANTS)}, '
                      f'got {self.accountant!r}')

  @property
  def adaptive(self) -> bool:
    return self.target_quantile is not None

  def count_noise(self, clients: int) -> float:
    """σ_b: the std of the noise on the count of unclipped clients."""
    return clients / 20 if self.count_stddev is None else self.count_stddev

  def update_noise_multiplier(self, clients: int) -> float:
    """z_Δ, the noise multiplier of the update sum: z itself without adaptive clipping, else
    (z⁻² − (2σ_b)⁻²)^(-1/2), which needs 2σ_b > z."""
    z = self.noise_multiplier
    if not self.adaptive or z == 0:
      return z
    sigma_b = self.count_noise(clients)
    if not 2 * sigma_b > z:
      raise UserError(f'dp adaptive clipping needs 2 * count_stddev > noise_multiplier; got '
                      f'count_stddev={sigma_b:g} for {clients} clients per round, z={z:g}')
    return (z**-2 - (2 * sigma_b)**-2)**-0.5

  def init(self, params: Any) -> DpState:
    del params
    return DpState(jnp.asarray(self.clip_norm, jnp.float32))

  def divisor(self, slots: int) -> float:
    """n, what the noised sum is divided by: `expected_clients`, or unset the slot count."""
    return slots if self.expected_clients is None else self.expected_clients

  def aggregate(self, state: DpState, deltas: Any, weights: jax.Array, rng: jax.Array,
                masked: bool = False) -> tuple[Any, DpState, dict[str, jax.Array]]:
    """(noised mean update, new state, metrics) from client-placed `deltas`; call inside the
    round's federated program. Only whether a weight is 0 (a padded slot; with `masked`, also
    a dropped straggler) is read."""
    n = self.divisor(jax.tree.leaves(deltas)[0].shape[0])
    # Only a Poisson cohort has padded slots, and only masked rounds drop stragglers.
    padded = self.expected_clients is not None or masked
    present = jnp.asarray(weights) > 0
    if padded:
      clipped, unclipped = federated_map(
          lambda d, p: clip_present(d, state.clip_norm, p), (deltas, present))
    else:  # Every slot a client: the plain clip, as XLA compiled it before padding existed.
      clipped, unclipped = federated_map(lambda d: clip(d, state.clip_norm), deltas)
    update_key, count_key = jax.random.split(jax.random.fold_in(rng, NOISE_STREAM))
    total, z_update = federated_sum(clipped), self.update_noise_multiplier(n)
    if z_update > 0:  # Skipped at z = 0, so C = ∞ stays finite.
      total = add_noise(total, z_update * state.clip_norm, update_key)
    mean = jax.tree.map(lambda x: x / n, total)
    metrics = {'dp_clip_norm': state.clip_norm,
               'dp_cohort_size': federated_sum(present.astype(jnp.float32))}
    if self.adaptive:
      below = federated_sum(jnp.where(present, unclipped.astype(jnp.float32) - 0.5, 0.0)
                            if padded else unclipped.astype(jnp.float32) - 0.5)
      below += self.count_noise(n) * jax.random.normal(count_key, ())
      fraction = below / n + 0.5
      metrics['dp_unclipped_fraction'] = fraction
      state = DpState(next_clip_norm(state.clip_norm, fraction, self.target_quantile,
                                     self.clip_learning_rate))
    return mean, state, metrics


def clip_present(tree: Any, clip_norm: jax.Array, present: jax.Array) -> tuple[Any, jax.Array]:
  """`clip(tree, clip_norm)` for a client in the cohort; zeros (and not unclipped) for a padded
  slot, whatever its update holds."""
  clipped, within = clip(tree, clip_norm)
  return (jax.tree.map(lambda x: jnp.where(present, x, jnp.zeros_like(x)), clipped),
          within & present)


def clip(tree: Any, clip_norm: jax.Array) -> tuple[Any, jax.Array]:
  """(`tree` scaled to L2 norm at most `clip_norm` over all leaves, whether it was within)."""
  norm = optax.tree.norm(tree)
  scale = jnp.minimum(1.0, clip_norm / norm)  # norm 0 or clip_norm ∞: scale 1.
  return jax.tree.map(lambda x: (x * scale).astype(x.dtype), tree), norm <= clip_norm


def add_noise(tree: Any, stddev: jax.Array, rng: jax.Array) -> Any:
  """`tree` plus independent N(0, stddev²) on every coordinate."""
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(rng, len(leaves))
  return treedef.unflatten([x + (stddev * jax.random.normal(k, x.shape, jnp.float32)
                                 ).astype(x.dtype) for x, k in zip(leaves, keys)])


def next_clip_norm(clip_norm: jax.Array, unclipped_fraction: jax.Array, target_quantile: float,
                   learning_rate: float) -> jax.Array:
  """Andrew et al.'s geometric update: C · exp(−η_C (b̄ − γ))."""
  return clip_norm * jnp.exp(-learning_rate * (unclipped_fraction - target_quantile))

