"""Mixture-of-experts feed-forward block: top-k token-choice routing, GShard-style dispatch.

Each token's router picks `experts_per_token` (k) experts; each expert takes at most
`capacity` tokens per routing group, and a token over capacity skips that expert (its
residual carries it on: it is *dropped* there, and counted). Groups are batch rows: the
capacity of a row is

    C = ceil(capacity_factor · k · T / E)        (T tokens in the row, E experts; at most T)

so routing never depends on how the batch is split over devices: a 1-device run and an
8-device `expert` mesh route every token the same way. Slots are handed out in priority
order: every token's first choice (in row order) before any second choice, as GShard does.
`capacity_factor=None` (or 0) is dropless: no slots, each token's k choices are grouped by
expert and run only there (`moe_dispatch`; `dispatch` picks its matmul), which computes what
C = T slots would at about k/E of their FLOPs.

Routers: the gates are the router softmax's top-k probabilities (softmax over all E experts
first, as Mixtral and Qwen-MoE compute it), renormalised to sum to 1 over the k choices when
`renormalize` (Mixtral always; Qwen-MoE's `norm_topk_prob`); None renormalises when k > 1 and
keeps the raw probability at k = 1 (Switch). `shared_d_ff` > 0 adds Qwen2-MoE's shared expert:
a dense (gated) MLP of that width that every token runs, scaled by sigmoid(x · w_shared_gate),
added to the routed experts' sum.

Dispatch and combine are einsums over one-hot masks [B, T, E, C]; the experts' inputs
[E, B, C, d] carry the logical axes ('expert', 'expert_batch', None, 'embed'), so on a mesh
with an `expert` axis XLA turns the einsums into all-to-alls between the batch's shards and
the experts' shards.

Auxiliary losses (GShard / Switch, ST-MoE), from the router's softmax p [B, T, E] before drops:
- load balance: E · Σ_e f_e · P_e, f_e the share of the B·T·k choices that picked e, P_e the
  mean of p[..., e]; 1 at perfect balance, E when one expert takes everything;
- router z-loss: the mean over tokens of logsumexp(logits)².
The block sows, into the 'moe' collection, per layer: 'loss' (aux_loss_weight · load balance +
router_z_loss_weight · z-loss: what training adds to its loss), 'aux_loss', 'z_loss',
'dropped' (the share of the B·T·k choices dropped) and 'max_load' (the busiest expert's share
of the choices). `summarize` reduces a 'moe' collection over layers.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from paxlike.layers import lora, moe_dispatch
from paxlike.layers.blocks import EMBED_ACT, MLP_ACTIVATIONS, Mlp

DType = Any

COLLECTION = 'moe'
# [E, B, C, d] slots, as the tokens' devices fill them (every expert, this batch shard) and as
# the experts' devices compute them (this expert shard, the batch over the other axes): the
# change from one to the other is the all-to-all.
SLOTS_BY_TOKEN = (None, 'batch', None, 'embed')
EXPERT_IN = ('expert', 'expert_batch', None, 'embed')
EXPERT_HIDDEN = ('expert', 'expert_batch', None, 'mlp')
MatMul = Callable[[jax.Array, jax.Array], jax.Array]  # (inputs, expert weights [E, in, out]).


def _by_slot(x: jax.Array, w: jax.Array) -> jax.Array:
  """Slots x [E, B, C, in] times each expert's weight w [E, in, out]."""
  return jnp.einsum('ebci,eio->ebco', x, w)


def capacity(tokens: int, num_experts: int, k: int, capacity_factor: float | None) -> int:
  """Slots per expert in a group of `tokens` tokens (see the module docstring)."""
  if not capacity_factor:
    return tokens
  return max(1, min(tokens, math.ceil(capacity_factor * k * tokens / num_experts)))


class Routing(NamedTuple):
  """Where each token goes. dispatch, combine: [B, T, E, C]; choices: [B, T, k] expert ids."""

  dispatch: jax.Array  # 1 where token (b, t) sits in slot c of expert e.
  combine: jax.Array  # dispatch × the token's gate for e.
  choices: jax.Array
  dropped: jax.Array  # int32: choices that found their expert full.


def top_k(probs: jax.Array, k: int, renormalize: bool | None = None
          ) -> tuple[jax.Array, jax.Array]:
  """(gates, choices) [B, T, k]: the top-k router probabilities (renormalised as `route` says)
  and their expert ids."""
  gates, choices = jax.lax.top_k(probs, k)
  if (k > 1) if renormalize is None else renormalize:
    gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
  return gates, choices


def route(probs: jax.Array, k: int, slots: int, dtype: DType = jnp.float32,
          renormalize: bool | None = None) -> Routing:
  """Top-k routing of router probabilities `probs` [B, T, E] into `slots` per expert and row.

  Gates are the chosen probabilities, renormalised to sum to 1 when `renormalize` (None: when
  k > 1; with k = 1 the raw probability, as in Switch, so the main loss still trains the router).
  """
  num_experts = probs.shape[-1]
  gates, choices = top_k(probs, k, renormalize)
  picked = jax.nn.one_hot(choices, num_experts, dtype=jnp.int32)  # [B, T, k, E]
  batch, length = probs.shape[:2]
  by_priority = jnp.swapaxes(picked, 1, 2).reshape(batch, k * length, num_experts)
  position = jnp.cumsum(by_priority, axis=1) * by_priority  # 1-based slot where picked.
  position = jnp.swapaxes(position.reshape(batch, k, length, num_experts), 1, 2)
  # A token picks an expert at most once, so summing over its k choices loses nothing.
  slot = jnp.sum(position, axis=2) - 1  # [B, T, E]: -1 where not picked.
  dispatch = jax.nn.one_hot(slot, slots, dtype=dtype)  # Zero rows for -1 and for slot >= C.
  gate = jnp.sum(gates[..., None] * picked, axis=2)  # [B, T, E]
  combine = gate.astype(dtype)[..., None] * dispatch
  kept = jnp.sum((slot >= 0) & (slot < slots), dtype=jnp.int32)
  return Routing(dispatch, combine, choices, batch * length * k - kept)


def load_balance_loss(probs: jax.Array, choices: jax.Array) -> jax.Array:
  """E · Σ_e f_e · P_e over all tokens (see the module docstring)."""
  num_experts = probs.shape[-1]
  share = expert_share(choices, num_experts)
  mean_prob = jnp.mean(probs.reshape(-1, num_experts), axis=0)
  return num_experts * jnp.sum(share * mean_prob)


def expert_share(choices: jax.Array, num_experts: int) -> jax.Array:
  """[E]: each expert's share of all the routing choices `choices` (int [..., k])."""
  counts = jnp.sum(jax.nn.one_hot(choices.reshape(-1), num_experts, dtype=jnp.float32), axis=0)
  return counts / choices.size


def z_loss(logits: jax.Array) -> jax.Array:
  """ST-MoE's router z-loss: mean over tokens of logsumexp(logits)²."""
  return jnp.mean(jnp.square(jax.nn.logsumexp(logits, axis=-1)))


def check_experts(num_experts: int, k: int) -> None:
  """ValueError unless top-`k` routing over `num_experts` experts makes sense, and the mesh
  in context (if any) splits the experts evenly over its 'expert' axis."""
  if num_experts < 1 or not 1 <= k <= num_experts:
    raise ValueError(f'experts_per_token={k} must be between 1 and num_experts={num_experts}')
  mesh = jax.sharding.get_abstract_mesh()
  ways = 1 if mesh.empty else dict(mesh.shape).get('expert', 1)
  if num_experts % ways:
    raise ValueError(f"mesh axis 'expert' of size {ways} does not divide "
                     f'num_experts={num_experts}')


class MoeMlp(nn.Module):
  """Drop-in for `blocks.Mlp` (x: [B, T, embed] -> [B, T, embed]) with `num_experts` experts,
  each a gated (or plain) MLP of width `d_ff`; `renormalize` and `shared_d_ff` (a shared expert
  under a sigmoid gate, params 'shared_expert' and 'shared_gate'): see the module docstring.
  LoRA (`lora_rank` > 0): each expert kernel named in `lora_targets` gets adapters of its own
  beside it, `<name>_lora_a` [E, in, r] and `<name>_lora_b` [E, r, out] (`lora.merge_lora`
  folds them in per expert); the shared expert's kernels get a dense MLP's adapters.
  `dispatch` ('auto', 'blocks', 'ragged', 'slots'): the dropless path's grouped matmul, or
  'slots' for the capped path at a slot per token (`moe_dispatch.resolve`)."""

  d_ff: int
  num_experts: int
  experts_per_token: int = 2
  capacity_factor: float | None = 1.25
  aux_loss_weight: float = 0.01
  router_z_loss_weight: float = 1e-3
  gated: bool = True
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32
  activation: str = 'silu'
  renormalize: bool | None = None
  shared_d_ff: int = 0
  lora_rank: int = 0
  lora_alpha: float = 16.0
  lora_targets: tuple[str, ...] = ()
  dispatch: str = 'auto'

  def _kernel(self, name: str, shape: tuple[int, ...], names: tuple[str, ...]) -> jax.Array:
    """An expert weight [E, in, out], initialised per expert with fan-in `in`."""
    init = nn.initializers.lecun_normal(batch_axis=(0,))
    kernel = self.param(name, nn.with_logical_partitioning(init, names), shape, self.param_dtype)
    return jnp.asarray(kernel, self.dtype)

  def _project(self, name: str, x: jax.Array, width: int, names: tuple[str, str],
               matmul: MatMul) -> jax.Array:
    """x (slots [E, B, C, in] or grouped rows [R, in]) through each expert's kernel `name`
    [E, in, width] by `matmul`, plus its LoRA adapters `<name>_lora_a` [E, in, r] and
    `<name>_lora_b` [E, r, width] when targeted."""
    shape = (self.num_experts, x.shape[-1], width)
    y = matmul(x, self._kernel(name, shape, ('expert', *names)))
    if not self.lora_rank or name not in self.lora_targets:
      return y
    if self.lora_rank > min(shape[1:]):
      raise ValueError(f'lora_rank={self.lora_rank} is larger than the expert {name} projection '
                       f'it adapts ({shape[1]} -> {shape[2]}); use at most {min(shape[1:])}')
    rank = self.lora_rank
    a = self.param(f'{name}_lora_a', nn.with_logical_partitioning(
        nn.initializers.lecun_normal(batch_axis=(0,)), ('expert', names[0], lora.RANK_AXIS)),
        (shape[0], shape[1], rank), self.param_dtype)
    b = self.param(f'{name}_lora_b', nn.with_logical_partitioning(
        nn.initializers.zeros, ('expert', lora.RANK_AXIS, names[1])),
        (shape[0], rank, width), self.param_dtype)
    low = matmul(x, jnp.asarray(a, self.dtype))
    scale = jnp.asarray(self.lora_alpha / rank, self.dtype)
    return y + matmul(low, jnp.asarray(b, self.dtype)) * scale

  def _experts(self, x: jax.Array, matmul: MatMul = _by_slot,
               constrain: Callable[[jax.Array, tuple], jax.Array] = nn.with_logical_constraint
               ) -> jax.Array:
    """Every expert's MLP: on its slots x [E, B, C, d], or (a grouped `matmul`, `constrain`
    a no-op) on its rows of the grouped buffer x [R, d]."""
    act = MLP_ACTIVATIONS[self.activation]
    up = lambda name: self._project(name, x, self.d_ff, ('embed', 'mlp'), matmul)
    h = act(up('wi_gate')) * up('wi_up') if self.gated else act(up('wi'))
    h = constrain(h, EXPERT_HIDDEN)
    return constrain(self._project('wo', h, x.shape[-1], ('mlp', 'embed'), matmul), EXPERT_IN)

  def _dispatch(self) -> str:
    """The dropless path's matmul here (`moe_dispatch.resolve`, the mesh's 'expert' ways)."""
    mesh = jax.sharding.get_abstract_mesh()
    ways = 1 if mesh.empty else dict(mesh.shape).get('expert', 1)
    return moe_dispatch.resolve(self.dispatch, expert_shards=ways)

  def _dropless(self, x: jax.Array, probs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(y, choices): each token through its k experts only (`moe_dispatch`), the tokens of
    each batch shard grouped apart."""
    gates, choices = top_k(probs, self.experts_per_token, self.renormalize)
    experts = lambda buffer, matmul: self._experts(buffer, matmul, lambda y, _: y)
    groups = math.gcd(x.shape[0], moe_dispatch.batch_shards())
    y = moe_dispatch.dropless(x, choices, gates, self.num_experts, experts, self.dispatch, groups,
                              nn.with_logical_constraint)
    return y, choices

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x: [B, T, embed] -> [B, T, embed]; sows the routing statistics (module docstring)."""
    check_experts(self.num_experts, self.experts_per_token)
    router = self.param(
        'router', nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('embed', None)),
        (x.shape[-1], self.num_experts), self.param_dtype)
    logits = jnp.einsum('btd,de->bte', x.astype(jnp.float32), router.astype(jnp.float32))
    probs = jax.nn.softmax(logits, axis=-1)
    x = jnp.asarray(x, self.dtype)
    if self.capacity_factor or self._dispatch() == 'slots':
      y, choices, dropped = self._capped(x, probs)
    else:
      (y, choices), dropped = self._dropless(x, probs), jnp.int32(0)
    if self.shared_d_ff:
      y = y + self._shared_expert(x)
    if not self.is_initializing():
      self._sow_stats(probs, logits, choices, dropped)
    return nn.with_logical_constraint(y, EMBED_ACT)

  def _capped(self, x: jax.Array, probs: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(y, choices, dropped): GShard dispatch into `capacity` slots per expert and row."""
    slots = capacity(x.shape[1], self.num_experts, self.experts_per_token, self.capacity_factor)
    routing = route(probs, self.experts_per_token, slots, self.dtype, self.renormalize)
    expert_in = nn.with_logical_constraint(
        jnp.einsum('btec,btd->ebcd', routing.dispatch, x), SLOTS_BY_TOKEN)
    expert_out = self._experts(nn.with_logical_constraint(expert_in, EXPERT_IN))
    expert_out = nn.with_logical_constraint(expert_out, SLOTS_BY_TOKEN)
    return (jnp.einsum('btec,ebcd->btd', routing.combine, expert_out), routing.choices,
            routing.dropped)

  def _shared_expert(self, x: jax.Array) -> jax.Array:
    """Qwen2-MoE's shared expert: sigmoid(x · w_gate) · MLP(x), every token, x [B, T, d]."""
    init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), ('embed', None))
    gate = self.param('shared_gate', init, (x.shape[-1], 1), self.param_dtype)
    scale = jax.nn.sigmoid(jnp.einsum('btd,do->bto', x, jnp.asarray(gate, self.dtype)))
    mlp = Mlp(self.shared_d_ff, self.gated, self.dtype, self.param_dtype, self.activation,
              self.lora_rank, self.lora_alpha, self.lora_targets, name='shared_expert')
    return scale * mlp(x)

  def _sow_stats(self, probs: jax.Array, logits: jax.Array, choices: jax.Array,
                 dropped: jax.Array) -> None:
    balance, z = load_balance_loss(probs, choices), z_loss(logits)
    stats = {
        'loss': self.aux_loss_weight * balance + self.router_z_loss_weight * z,
        'aux_loss': balance,
        'z_loss': z,
        'dropped': dropped / choices.size,
        'max_load': jnp.max(expert_share(choices, self.num_experts)),
    }
    for name, value in stats.items():
      self.sow(COLLECTION, name, value.astype(jnp.float32))


def is_moe(model: Any) -> bool:
  """Whether `model` has MoE layers (a `TransformerLM` with num_experts > 0)."""
  return bool(getattr(model, 'num_experts', 0))


def summarize(collection: Any) -> dict[str, jax.Array]:
  """A 'moe' collection (any nesting: unrolled, scanned, grouped) -> per-step scalars: the
  mean over MoE layers of 'loss', 'aux_loss', 'z_loss' and 'dropped', and the max over layers
  of 'max_load'. Empty when no MoE layer ran."""
  values: dict[str, list[jax.Array]] = {}
  for path, leaf in traverse_util.flatten_dict(nn.unbox(dict(collection))).items():
    name = path[-1]
    for value in leaf if isinstance(leaf, tuple) else (leaf,):
      values.setdefault(name, []).append(jnp.ravel(value))
  reduce = lambda name: jnp.max if name == 'max_load' else jnp.mean
  return {name: reduce(name)(jnp.concatenate(vs)) for name, vs in values.items()}
