"""Device meshes from config, and logical-axis rules turned into `NamedSharding`s.

A mesh is `ici` (devices inside a slice or host) times `dcn` (across slices or hosts), with
one name per axis. Layers name their weights and activations with logical axes ('batch',
'embed', 'mlp', ...); `rules` map those to mesh axes. Rules that name a mesh axis the mesh
doesn't have map to None, so one rule table serves every mesh.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from paxlike.errors import UserError

# Mesh axes that split the batch, in the order they are folded into the batch dimension.
# 'expert' holds a shard of the experts in MoE layers and is data parallel everywhere else.
BATCH_AXES = ('data', 'fsdp', 'expert')
EXPERT_AXIS = 'expert'
STAGE_AXIS = 'stage'
CLIENTS_AXIS = 'clients'

LogicalRules = tuple[tuple[str, Any], ...]

DEFAULT_RULES: LogicalRules = (
    ('batch', BATCH_AXES),
    ('clients', CLIENTS_AXIS),
    ('embed', 'fsdp'),
    ('mlp', 'model'),
    ('heads', 'model'),
    ('kv_heads', 'model'),
    ('vocab', 'model'),
    ('kv', None),
    ('length', None),
    ('layers', STAGE_AXIS),  # A scanned stack's layer axis: split into pipeline stages.
    ('lora_rank', None),  # LoRA adapters' rank axis: small, replicated.
    # MoE (paxlike.layers.moe): expert weights and the experts' token slots split on 'expert';
    # while the slots are split by expert, their batch dim is split by the other batch axes.
    ('expert', EXPERT_AXIS),
    ('expert_batch', ('data', 'fsdp')),
)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Mesh shape and logical rules. A -1 in `ici` takes all devices left over."""

  ici: tuple[int, ...] = (-1,)
  dcn: tuple[int, ...] | None = None
  axes: tuple[str, ...] = ('data',)
  rules: LogicalRules = DEFAULT_RULES

  def __post_init__(self):
    if len(self.ici) != len(self.axes) or (self.dcn and len(self.dcn) != len(self.axes)):
      raise UserError(f'mesh: ici={self.ici} dcn={self.dcn} and axes={self.axes} differ in length')
    if len(set(self.axes)) != len(self.axes):
      raise UserError(f'mesh: repeated axis name in {self.axes}')
    if self.ici.count(-1) > 1 or any(s == 0 or s < -1 for s in self.ici + (self.dcn or ())):
      raise UserError(f'mesh: bad shape ici={self.ici} dcn={self.dcn} (positive sizes, at most one -1)')


def mesh_shape(cfg: MeshConfig, num_devices: int) -> tuple[int, ...]:
  """The full (ici × dcn) shape for `num_devices`, or a UserError saying why it can't fit."""
  dcn = cfg.dcn or (1,) * len(cfg.axes)
  known = math.prod(s for s in cfg.ici if s != -1) * math.prod(dcn)
  ici = cfg.ici
  if -1 in ici:
    if num_devices % known:
      raise UserError(f'mesh ici={cfg.ici} dcn={cfg.dcn} does not divide {num_devices} devices')
    ici = tuple(num_devices // known if s == -1 else s for s in ici)
  shape = tuple(i * d for i, d in zip(ici, dcn))
  if math.prod(shape) != num_devices:
    raise UserError(f'mesh {dict(zip(cfg.axes, shape))} needs {math.prod(shape)} devices, '
                    f'but {num_devices} are available')
  return shape


def make_mesh(cfg: MeshConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A GSPMD (Auto-axes) mesh over `devices` (default: all global devices)."""
  devices = list(devices if devices is not None else jax.devices())
  shape = mesh_shape(cfg, len(devices))
  if cfg.dcn and math.prod(cfg.dcn) > 1:
    ici = tuple(s // d for s, d in zip(shape, cfg.dcn))
    # Without TPU slices (CPU, GPU), each process is one DCN granule.
    one_slice = len({getattr(d, 'slice_index', 0) for d in devices}) == 1
    try:
      grid = mesh_utils.create_hybrid_device_mesh(
          ici, cfg.dcn, devices, process_is_granule=one_slice, allow_split_physical_axes=True)
    except ValueError as error:
      raise UserError(f'mesh dcn={cfg.dcn} does not match the hosts/slices: {error}') from None
  else:
    grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  return Mesh(grid, cfg.axes, axis_types=(AxisType.Auto,) * len(cfg.axes))


def rules_for_mesh(rules: LogicalRules, mesh: Mesh) -> LogicalRules:
  """`rules` with every mesh axis the mesh lacks (or has at size 1) dropped."""
  def keep(axes):
    axes = axes if isinstance(axes, tuple) else (axes,)
    kept = tuple(a for a in axes if a is not None and mesh.shape.get(a, 1) > 1)
    return kept[0] if len(kept) == 1 else (kept or None)
  return tuple((name, keep(axes)) for name, axes in rules)


def logical_shardings(boxed_tree: Any, mesh: Mesh, rules: LogicalRules) -> Any:
  """NamedShardings for a tree of `nn.LogicallyPartitioned` boxes (e.g. from `eval_shape(init)`).

  A weight whose logical axis has no rule is an error: silent replication of a big weight is a
  bug waiting to surface on a pod.
  """
  known = {name for name, _ in rules}
  specs = nn.get_partition_spec(boxed_tree)
  for spec in jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, P)):
    missing = [a for a in spec if a is not None and a not in known]
    if missing:
      raise UserError(f'logical axis {missing[0]!r} has no sharding rule; add it to mesh.rules')
  return nn.logical_to_mesh_sharding(specs, mesh, rules_for_mesh(rules, mesh))


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
  """The mesh axes that split a batch dimension."""
  return tuple(a for a in BATCH_AXES if a in mesh.axis_names)


def round_batch_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding of a `[clients, local_steps, batch, ...]` array: clients on 'clients', batch on data axes."""
  clients = CLIENTS_AXIS if CLIENTS_AXIS in mesh.axis_names else None
  return NamedSharding(mesh, P(clients, None, batch_axes(mesh) or None))


def eval_batch_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding of a `[batch, ...]` eval array: batch on the data axes."""
  return NamedSharding(mesh, P(batch_axes(mesh) or None))


def client_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding of a `[clients]` vector (e.g. client weights)."""
  return NamedSharding(mesh, P(CLIENTS_AXIS if CLIENTS_AXIS in mesh.axis_names else None))


def check_divisible(mesh: Mesh, clients_per_round: int, batch_size: int,
                    eval_batch_size: int | None = None) -> None:
  """UserError unless the cohort and the per-client (and eval) batches split evenly over the mesh."""
  clients = mesh.shape.get(CLIENTS_AXIS, 1)
  if clients_per_round % clients:
    raise UserError(f'{clients_per_round} clients per round do not divide over mesh axis '
                    f"'clients' of size {clients}")
  shards = math.prod(mesh.shape[a] for a in batch_axes(mesh))
  for name, size in (('batch size', batch_size), ('eval batch size', eval_batch_size)):
    if size is not None and size % shards:
      raise UserError(f'{name} {size} does not divide over mesh axes '
                      f'{batch_axes(mesh)} of total size {shards}')


def host_to_global(tree: Any, sharding: NamedSharding) -> Any:
  """Put host numpy arrays (the full global array, same on every process) onto the mesh."""
  def put(x: np.ndarray) -> jax.Array:
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
  return jax.tree.map(put, tree)


def process_block(sharding: NamedSharding, shape: tuple[int, ...]) -> tuple[slice, ...]:
  """The smallest box of a `shape` array (or of its leading dims) holding every shard this
  process's devices own: what the process loads. The whole array on one process; where a
  process's shards are not contiguous (e.g. batch rows on two mesh axes in the wrong order),
  the box also spans rows of other processes, which are loaded but not used."""
  indices = sharding.addressable_devices_indices_map(shape).values()
  bounds = [[index[d].indices(n)[:2] for index in indices] for d, n in enumerate(shape)]
  return tuple(slice(min(b[0] for b in dim), max(b[1] for b in dim)) for dim in bounds)


def block_to_global(tree: Any, sharding: NamedSharding, block: tuple[slice, ...],
                    leading_shape: tuple[int, ...]) -> Any:
  """Put this process's `block` (from `process_block`) of each global array onto the mesh.

  Leaves have the block's extent on the leading dims and their full extent on the rest; the
  global arrays have `leading_shape` in front. Each device's shard is cut from the block.
  """
  def put(x: np.ndarray) -> jax.Array:
    extent = tuple(b.stop - b.start for b in block)
    if x.shape[:len(block)] != extent:
      raise ValueError(f'a block {x.shape} does not match the process block {extent}: does the '
                       'data source honour clients= and rows=?')

    def shard(index: tuple[slice, ...]) -> np.ndarray:
      local = tuple(slice(*(i - b.start for i in d.indices(n)[:2]))
                    for d, b, n in zip(index, block, leading_shape))
      return x[local + tuple(index[len(block):])]
    return jax.make_array_from_callback((*leading_shape, *x.shape[len(block):]), sharding, shard)
  return jax.tree.map(put, tree)


def constrain_like_params(tree: Any, params: Any, param_shardings: Any) -> Any:
  """`tree` with every subtree shaped like `params` (same structure and leaf shapes; `params`
  may be abstract: an optimizer's moments, say) constrained to `param_shardings`. Call under
  jit. Without it,
  `zeros_like(params)` comes out replicated and every step all-gathers the update into it."""
  structure = jax.tree.structure(params)
  shapes = [np.shape(x) for x in jax.tree.leaves(params)]

  def like_params(node: Any) -> bool:
    return (jax.tree.structure(node) == structure
            and [np.shape(x) for x in jax.tree.leaves(node)] == shapes)

  return jax.tree.map(
      lambda node: (jax.lax.with_sharding_constraint(node, param_shardings)
                    if like_params(node) else node),
      tree, is_leaf=like_params)
