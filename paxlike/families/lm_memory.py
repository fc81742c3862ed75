"""Per-device training memory of an LM task, from shapes: nothing is allocated or compiled.

    params + optimizer state + gradients   exact bytes of the real trees (`jax.eval_shape` of
                                           the model's and the optimizer's init), each leaf
                                           divided by the mesh axes its logical names map to
    reference                              a full fine-tune's DPO or IPO (no LoRA) keeps a
                                           frozen copy of the params, sharded like them
                                           (paxlike/trainer/reference.py): the params' bytes
    activations                            what the step holds at its peak beyond those, for an
                                           LM (below)

The activations, per token, at the start of the backward pass (measured against XLA's
`compiled.memory_analysis()`: tests/families/test_lm_memory.py):
- every layer keeps its input (the scan carry): d_model elements;
- remat 'dots' (matmuls without batch dims saveable) also keeps q, k, v (n_heads + 2·n_kv_heads)
  ·head_dim, the attention projection's output d_model (the residual sum is recomputed from it)
  and the MLP's gate and up (2 if gated else 1)·d_ff; the MLP's output is never needed;
- remat 'none' keeps everything: also a norm output d_model, rotated q and k and the attention
  output (3·n_heads·head_dim), both norms' float32 residuals (3·d_model float32 each), the
  MLP's activation and product (2·(2 if gated else 1)·d_ff), and with XLA attention the
  [heads, T] scores of every query in float32 and the compute dtype (whole squares: the mask
  is applied to them; flash kernels keep one float32 log-sum-exp per head); every layer's
  kernels cast to the compute dtype are kept too (a per-step constant);
- 'dots_attention' keeps what 'dots' keeps plus, with a Pallas (splash) kernel, its outputs:
  the attention output (n_heads·head_dim) and the softmax statistics, float32 and replicated
  over 128 lanes per head (splash's layout: 12.5 KB per token and layer for the 350M, measured
  on a TPU v5e as 11.84 - 9.37 GB at batch 4); with XLA attention it is 'dots';
- 'full' keeps only the input; an unknown policy is counted as 'none';
- the peak adds the larger of the head (float32 and compute-dtype logits, (4 + size)·vocab
  bytes, and the final norm's float32 residuals and output) and one layer's backward (what it
  recomputes, plus with XLA attention three float32 [heads, T] working copies of its scores);
- after the backward pass the optimizer updates one leaf at a time, so the peak is at least the
  largest leaf (the 1B's stacked MLP kernels: 1 GB): the larger of that and the activations;
- the head's kernel cast to the compute dtype is held whatever the batch;
- an optimizer whose moments are narrower than float32 (bf16 moments) or factored (Adafactor)
  materializes a float32 tree of updates as large as the trained params (LoRA's: its
  adapters'; seen on XLA:CPU, not on a TPU, whose XLA fuses it into the update; optax's
  float32 AdamW updates in place);
- preference pairs: a batch of `batch_size` pairs holds 2 · batch_size sequences (the
  reference's forward pass keeps nothing for the backward one);
- a MoE layer's MLP instead keeps its router's float32 logits (E; with 'dots') and, with
  'none', its probabilities (E), the dispatch and combine masks (2·E·C per row, the per-row
  term that grows with T), the experts' input and output slots (2·d·S) and hidden (2·mlp·S),
  S = E·C / T slots per token (C the capacity; E when dropless), and the combined output d,
  mlp sized by moe_d_ff; a shared expert (moe_shared_d_ff) keeps what a dense MLP of its width
  keeps.
Elements are in the compute dtype unless said. On a 'stage' mesh (a GPipe pipeline of p stages
and m microbatches, paxlike.layers.pipeline) a device runs L/p layers for m + p − 1 iterations
of one microbatch each, keeping each iteration's activations (the bubble's too), so the layer
terms are multiplied by (m + p − 1) / (m p); the recompute is one layer of one microbatch; the
head is computed by every stage. Tokens per device are the global batch divided by the mesh
axes that split the batch; a 'model' (tensor parallel) axis further splits everything but the
d_model-wide terms.

A federated round (a cohort of N clients, N / k per device on a 'clients' axis of k) trains c
clients at a time (`algorithm.client_chunk`, else the platform's default: chunking.py; all of
them where that is unset), one local step after another, so it holds: the algorithm's state
(`jax.eval_shape` of its init: server params and optimizer, and what it keeps per client);
for each of the c clients a copy of the trained params, its optimizer state, its gradients
and one local step's activations; and, trained a chunk at a time, the N clients' trained params
stacked for the aggregate, with a new copy of what the state keeps per client (all at once,
those are the c clients' own; a slot that keeps its own params, PAPA's members, returns them
as kept state). A round that trains the pooled cohort as one model (BTM's seed phase, in the
same program as its experts' rounds: `Algorithm.pools_cohort`) holds the whole cohort's
activations whatever the chunk. Within 15% of XLA:CPU's figure for FedAvg, DiLoCo, PAPA and
BTM with and without a seed phase, one client at a time and all at once, where a local step's
activations outweigh the params (tests/families/test_lm_memory.py); where the params outweigh
them it comes out 0.8-1.0 of it (the aggregation's own temporaries are not counted; PAPA with
every client at once is the 0.8).

How close: within 4% of XLA's figure for the 125M, 350M and 1B presets at seq 2048, on CPU
(arguments + outputs − aliased + temporaries) and on a TPU v5e (`peak_memory_in_bytes`, the
figure its out-of-memory error names); shallow 2- and 4-layer models of the same widths come
out 12–18% high on the TPU, whose fusion keeps only ~4–5.5 bytes of logits per vocab entry
where XLA:CPU keeps ~7 (this counts 6). XLA:CPU's temporaries are not a peak: the TPU's peak
is 8–30% below its own arguments + temporaries.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from paxlike.core import partitioning
from paxlike.core.trainable import split_params
from paxlike.errors import UserError
from paxlike.families.lm_flops import mean_attended_keys
from paxlike.federated import chunking
from paxlike.layers import TransformerLM, lora, moe

Task = Any  # paxlike.trainer.task.Task (which imports the families: named, not imported, here).

GB = 1e9


@dataclasses.dataclass(frozen=True)
class Estimate:
  """Bytes per device of each part of the training state, on `devices` devices."""

  devices: int
  mesh: dict[str, int]
  params: float
  optimizer: float
  gradients: float
  activations: float
  reference: float = 0.0  # A full fine-tune DPO's frozen copy of the params.
  clients: str = ''  # A federated round's clients at a time, for the line.

  @property
  def total(self) -> float:
    return self.params + self.optimizer + self.gradients + self.activations + self.reference

  def line(self) -> str:
    mesh = ' × '.join(f'{axis} {size}' for axis, size in self.mesh.items())
    reference = f' + reference {self.reference / GB:.2f}' if self.reference else ''
    clients = f' ({self.clients})' if self.clients else ''
    return (f'# memory per device on {self.devices} devices ({mesh}): {self.total / GB:.1f} GB = '
            f'params {self.params / GB:.2f} + optimizer {self.optimizer / GB:.2f} + gradients '
            f'{self.gradients / GB:.2f} + activations {self.activations / GB:.2f}{reference}'
            f'{clients}\n')


def keeps_reference_copy(task: Task) -> bool:
  """Whether `task` trains a preference loss with a reference (dpo, ipo) on a model without
  LoRA adapters: then the trainer keeps a frozen copy of the params (`LoraSpec.copies_reference`,
  the rule trainer/reference.py's `needs_copy` asks too)."""
  needs = bool(getattr(getattr(task, 'loss', None), 'needs_reference', False))
  return lora.LoraSpec.of(task.model).copies_reference(needs)


def _ways(names: tuple[str | None, ...], mesh: dict[str, int], rules: dict[str, Any]) -> int:
  """How many devices split a leaf named `names` (its logical axes) on `mesh`."""
  ways = 1
  for name in names:
    axes = rules.get(name) if name else None
    for axis in axes if isinstance(axes, tuple) else (axes,):
      ways *= mesh.get(axis, 1) if axis else 1
  return ways


def _mlp_bytes(model: TransformerLM, seq_len: int, mlp_in: float,
               size: int) -> tuple[dict[str, float], dict[str, float]]:
  """Bytes per token a dense and a MoE layer's MLP keep, split into what remat 'dots' keeps
  ('dots') and what only 'none' keeps as well ('rest'); see the module docstring."""
  d, experts = model.d_model, model.num_experts
  # 'dots' keeps the projections' outputs (gate and up); 'none' also the activation and the
  # product, and XLA keeps two more of that width (the activation's pieces).
  dense = {'dots': mlp_in * size, 'rest': 2 * mlp_in * size}
  if not experts:
    return dense, dense
  # E·C: a row's expert slots, and each token's entries in the dispatch (and combine) mask.
  slots = experts * moe.capacity(seq_len, experts, model.experts_per_token,
                                 model.capacity_factor)
  per_token = slots / seq_len
  expert_in = mlp_in * (model.moe_d_ff or model.d_ff) / model.d_ff
  shared_in = mlp_in * model.moe_shared_d_ff / model.d_ff  # A dense MLP every token runs.
  shared = {'dots': (shared_in + d) * size if shared_in else 0.0, 'rest': shared_in * size}
  sparse = {'dots': experts * 4 + shared['dots'],
            'rest': experts * 4 + shared['rest']
                    + (2 * slots + (2 * d + 2 * expert_in) * per_token + d) * size}
  return dense, sparse


def pipeline_share(stages: int, microbatches: int) -> float:
  """The share of the whole layer stack's kept activations one device of a GPipe pipeline holds:
  its 1/p of the layers over m + p − 1 microbatch iterations, against m without a pipeline."""
  return (microbatches + stages - 1) / (microbatches * stages)


def head_bytes_per_token(model: TransformerLM, model_ways: int = 1) -> float:
  """What the head holds per token at the start of the backward pass: the logits as the
  matmul gives them (compute dtype) and in float32, and the final norm's float32 residuals
  (three d-wide) with its output."""
  size = jnp.dtype(model.dtype).itemsize
  return (4 + size) * model.vocab_size / model_ways + (3 * 4 + size) * model.d_model


def activation_bytes_per_token(model: TransformerLM, seq_len: int, kernel: str,
                               model_ways: int = 1, stages: int = 1,
                               microbatches: int = 1) -> float:
  """Bytes the backward pass keeps per token at its peak, on one of `model_ways`
  tensor-parallel shards of a stage of a `stages`-stage pipeline of `microbatches` (see the
  module docstring)."""
  d, layers = model.d_model, model.num_layers
  head_dim = model.head_size()
  heads = model.num_heads / model_ways
  q_width = heads * head_dim
  kv_width = (model.num_kv_heads or model.num_heads) / model_ways * head_dim
  mlp_in = (2 if model.gated_mlp else 1) * model.d_ff / model_ways
  size = jnp.dtype(model.dtype).itemsize
  # 'dots': the layer's input, q, k, v and the attention projection's output.
  shared_dots = (2 * d + q_width + 2 * kv_width) * size
  if kernel == 'xla':  # The [heads, T, T] scores, whole squares (the mask is applied to them).
    kept_scores, working_scores = heads * seq_len * (4 + size), 3 * 4 * heads * seq_len
  else:  # A flash kernel keeps its output's float32 log-sum-exp per head.
    kept_scores, working_scores = heads * 4, 0.0
  # 'none' also: a norm output, rotated q and k and the attention output, and both norms'
  # float32 residuals (three d-wide each).
  shared_rest = (d + 3 * q_width) * size + 2 * 3 * d * 4 + kept_scores
  # 'dots_attention': also the kernel's output and its lane-replicated float32 statistics.
  kernel_out = q_width * size + heads * 128 * 4 if kernel == 'splash' else 0.0
  policy = (model.remat_policy if model.remat_policy in ('none', 'dots', 'full', 'dots_attention')
            else 'none')
  total, working = 0.0, 0.0
  for layer, mlp in enumerate(_mlp_bytes(model, seq_len, mlp_in, size)):
    count = sum(model.is_moe_layer(i) == bool(layer) for i in range(layers))
    everything = shared_dots + mlp['dots'] + shared_rest + mlp['rest']
    keeps = {'none': everything, 'dots': shared_dots + mlp['dots'], 'full': d * size,
             'dots_attention': shared_dots + mlp['dots'] + kernel_out}[policy]
    total += count * keeps
    if count:  # One layer's backward recomputes what it did not keep and works on the scores
      # (XLA attention: their float32 working set instead of the kept copy).
      recompute = everything - keeps - (kept_scores if policy != 'none' else 0.0)
      working = max(working, recompute + working_scores)
  head = head_bytes_per_token(model, model_ways)
  return total * pipeline_share(stages, microbatches) + max(working / microbatches, head)


def fixed_activation_bytes(model: TransformerLM, layer_param_bytes: float,
                           model_ways: int = 1) -> float:
  """Bytes the backward pass keeps whatever the batch: the head's kernel cast to the compute
  dtype, and with remat 'none' every layer's kernels cast (`layer_param_bytes`: the layers'
  params on this device, in their own dtype)."""
  size, param_size = (jnp.dtype(model.dtype).itemsize, jnp.dtype(model.param_dtype).itemsize)
  if size >= param_size:
    return 0.0
  head = model.d_model * model.vocab_size / model_ways * size
  return head + (layer_param_bytes * size / param_size if model.remat_policy == 'none' else 0.0)


def _updates_materialized(opt_state: Any) -> bool:
  """Whether the optimizer's update is a whole float32 tree beside the step's activations:
  seen on XLA:CPU for moments stored narrower than float32 (bf16 moments: read up, updated,
  rounded back) and for Adafactor's factored moments (its update is normalized by its own
  RMS); optax's float32 AdamW updates in place, a leaf at a time. On a TPU (an estimate with
  the splash kernel, the TPU's) XLA fuses them into the update: the 350M's one-chip fit, bf16
  params and moments, peaked at 12.81 GB there, where counting them made 15.18 GB and leaving
  them out 13.68 (docs/benchmarks.md, fifth session)."""
  nodes = jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, optax.FactoredState))
  return any(isinstance(x, optax.FactoredState)
             or (jnp.issubdtype(x.dtype, jnp.floating) and x.dtype.itemsize < 4 and x.ndim)
             for x in nodes)


def estimate(task: Task, devices: int, kernel: str | None = None) -> Estimate:
  """The per-device estimate for `task` on `devices` devices, with attention `kernel` (None:
  what the model resolves to on this platform); UserError if its mesh can't fit."""
  mesh_cfg = task.mesh
  mesh = dict(zip(mesh_cfg.axes, partitioning.mesh_shape(mesh_cfg, devices)))
  rules = dict(mesh_cfg.rules)
  data, model = task.data, task.model
  sample = jax.ShapeDtypeStruct((1, data.seq_len), jnp.int32)
  boxed = jax.eval_shape(model.init, jax.random.key(0), sample)['params']
  paths = jax.tree_util.tree_flatten_with_path(
      boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))[0]
  leaves = [x for _, x in paths]
  stored = sum(x.value.size * x.value.dtype.itemsize for x in leaves)
  on_device = [x.value.size * x.value.dtype.itemsize / _ways(x.names, mesh, rules) for x in leaves]
  params = sum(on_device)
  layer_params = sum(b for (path, _), b in zip(paths, on_device)
                     if str(getattr(path[0], 'key', '')).startswith('block'))
  # LoRA trains its adapters alone: gradients and optimizer state are theirs (a quantized base
  # is counted in its stored bytes above, and never trained).
  trained_tree, trained, trained_stored = nn.unbox(boxed), params, stored
  mask = lora.LoraSpec.of(model).mask
  if mask is not None:
    marks = jax.tree.leaves(mask(trained_tree))
    trained_tree = split_params(trained_tree, mask)[0]
    trained = sum(b for b, mark in zip(on_device, marks) if mark)
    trained_stored = sum(x.value.size * x.value.dtype.itemsize
                         for x, mark in zip(leaves, marks) if mark)
  opt_state = jax.eval_shape(task.optimizer.init, trained_tree)
  optimizer = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(opt_state))
  # Optimizer states mirror the trained params and are sharded like them.
  optimizer *= trained / max(trained_stored, 1)
  batch_ways = math.prod(mesh.get(a, 1) for a in partitioning.BATCH_AXES)
  rows = data.batch_size * data.rows_per_item  # A pair: 2 sequences.
  tokens = rows * data.seq_len / batch_ways  # A round's: one client's local step.
  kernel = kernel or model.attention_kernel(data.seq_len)
  stages = mesh.get(partitioning.STAGE_AXIS, 1)
  activations = tokens * activation_bytes_per_token(
      model, data.seq_len, kernel, mesh.get('model', 1), stages,
      task.train.microbatches if stages > 1 else 1)
  quantized = getattr(model, 'base_quantization', 'none') != 'none'
  activations += fixed_activation_bytes(model, 0.0 if quantized else layer_params,
                                        mesh.get('model', 1))
  if quantized:  # Kernels dequantized to the compute dtype: every layer's with remat 'none'
    # (the backward pass needs them all), else one layer's at a time.
    dequantized = _layer_elements(model.clone(base_quantization='none'), sample, mesh, rules)
    dequantized *= jnp.dtype(model.dtype).itemsize
    activations += dequantized / (1 if model.remat_policy == 'none' else model.num_layers)
  updates_fused = kernel == 'splash'  # A TPU's XLA (see _updates_materialized).
  if not updates_fused and _updates_materialized(opt_state):  # float32 updates, as trained.
    activations += trained * 4 / _mean_itemsize(trained_tree)
  # After the backward pass the optimizer updates a leaf at a time: the largest leaf's update
  # is one more buffer of its size (the 1B's stacked MLP kernels: 1 GB) while the activations
  # are gone; the peak is the larger of the two.
  activations = max(activations, max(on_device, default=0.0))
  step = Estimate(devices, mesh, params, optimizer, trained, activations,
                  reference=params if keeps_reference_copy(task) else 0.0)
  if not is_round(task):
    return step
  share = params / max(stored, 1)  # This device's part of the params.
  return _round(task, step, *_algorithm_state(task, nn.unbox(boxed)), share)


def _round(task: Task, step: Estimate, state: float, per_slot: float, pooled: bool,
           share: float) -> Estimate:
  """A federated round's estimate from one client's local `step`: the algorithm's `state`
  bytes, `per_slot` of them kept for each cohort slot (a fixed cohort's), both times the
  device's `share` of the params (`step.gradients` are the trained params' bytes: each
  client's working copy of them); `pooled`: some round trains the cohort's batches at once."""
  clients_ways = step.mesh.get(partitioning.CLIENTS_AXIS, 1)
  cohort = task.data.clients_per_round // clients_ways
  state, per_slot = state * share, per_slot * share
  kept = cohort * per_slot  # Client-placed: split over the clients axis.
  chunk = min(_client_chunk(task, clients_ways, step.devices) or cohort, cohort)
  if chunk < cohort:  # The chunks' outputs: what the state keeps, new, and every client's
    # trained params, unless a slot keeps its own (PAPA's members, BTM's experts: in `kept`).
    holds_params = per_slot >= step.gradients + step.optimizer
    stacked, kept_again = (0.0 if holds_params else cohort * step.gradients), kept
  else:  # All at once: the clients' own copies are those (and what the state keeps, the carry).
    stacked, kept_again = 0.0, -kept
  return dataclasses.replace(
      step, params=step.params + chunk * step.gradients + stacked,
      optimizer=state - step.params + chunk * step.optimizer + kept_again,
      gradients=chunk * step.gradients,
      activations=(cohort if pooled else chunk) * step.activations,
      clients=f'{chunk} of {cohort} clients at a time')


def is_round(task: Task) -> bool:
  """Whether `task` trains federated rounds (a cohort, or local steps, beyond one)."""
  data = task.data
  return getattr(data, 'clients_per_round', 1) * getattr(data, 'local_steps', 1) > 1


def _client_chunk(task: Task, clients_ways: int, devices: int) -> int | None:
  """The clients a round trains at a time: `algorithm.client_chunk`, else the platform's
  default (None: all at once): this host's for its own device count, an accelerator's for the
  pod sizes print_config adds."""
  platform = jax.default_backend() if devices == jax.device_count() else 'tpu'
  return (chunking.configured_client_chunk(task.algorithm)
          or chunking.default_client_chunk(platform, clients_ways))


def _algorithm_state(task: Task, params: Any) -> tuple[float, float, bool]:
  """(bytes of the algorithm's state, bytes it keeps for each slot of a fixed cohort: what a
  cohort one larger adds, 0 where the clients start fresh each round; whether some round pools
  the cohort, `Algorithm.pools_cohort`), from init's shapes."""

  def never_called(*args: Any) -> None:
    raise AssertionError("the memory estimate traces only the algorithm's init")

  def state_bytes(algorithm: Any) -> float:
    mask = lora.LoraSpec.of(task.model).mask
    if mask is not None and algorithm.over_trainable is not None:
      algorithm = algorithm.over_trainable(mask)
    return sum(x.size * x.dtype.itemsize
               for x in jax.tree.leaves(jax.eval_shape(algorithm.init, params)))

  algorithm = task.algorithm(never_called, task.optimizer)
  state, fixed = state_bytes(algorithm), algorithm.fixed_cohort
  if fixed is None:
    return state, 0.0, algorithm.pools_cohort
  return state, state_bytes(fixed.resized(fixed.size + 1)) - state, algorithm.pools_cohort


def _mean_itemsize(tree: Any) -> float:
  """Bytes per element of `tree`'s leaves, over all of them."""
  leaves = jax.tree.leaves(tree)
  return sum(x.size * x.dtype.itemsize for x in leaves) / max(sum(x.size for x in leaves), 1)


def _layer_elements(model: TransformerLM, sample: Any, mesh: dict[str, int],
                    rules: dict[str, Any]) -> float:
  """Elements of the layers' params on one device (a float model's)."""
  boxed = jax.eval_shape(model.init, jax.random.key(0), sample)['params']
  paths = jax.tree_util.tree_flatten_with_path(
      boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))[0]
  return sum(x.value.size / _ways(x.names, mesh, rules) for path, x in paths
             if str(getattr(path[0], 'key', '')).startswith('block'))


def summary(task: Task, device_counts: tuple[int, ...] = (8, 64, 256)) -> str:
  """Estimate lines for `--mode=print_config`: for this host's device count and for the pod
  sizes in `device_counts` that the mesh and batch fit."""
  lines = []
  for devices in sorted({jax.device_count(), *device_counts}):
    try:
      mesh = partitioning.mesh_shape(task.mesh, devices)
    except UserError:
      continue
    shape = dict(zip(task.mesh.axes, mesh))
    if task.data.batch_size % math.prod(shape.get(a, 1) for a in partitioning.BATCH_AXES):
      continue
    lines.append(estimate(task, devices).line())
  return ''.join(lines)
