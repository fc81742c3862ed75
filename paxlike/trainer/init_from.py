"""`train.init_from`: a fresh run's params from a Hugging Face checkpoint dir (`'hf:DIR'`), a
PEFT LoRA adapter dir on its base (`'hf:ADAPTER'`, the base the adapter_config.json names when
that is a local directory, else `'hf:ADAPTER@BASE'`), or another paxlike job's committed
checkpoint (`'job:DIR'`, `'job:DIR@STEP'`; params only).

`load_params` checks every name and shape against the run's abstract params from the source's
headers (safetensors) or metadata (Orbax) before it reads any data, then places each tensor
with its sharding as it is read: an HF checkpoint one tensor at a time (a scanned model's
layers one tensor at a time, stacked on the devices), a job's params by Orbax's partial restore
of `alg.params` straight into their shardings. Leaves the source lacks must be adapters (LoRA),
which keep their fresh init, unless the source is a PEFT adapter: then its lora_A/lora_B are
the adapters (`paxlike.interop.peft`; the model's LoRA fields are the adapter's). The trainer
calls it on a fresh start only (`loop.restore_or_init`).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any, Callable, Iterator

import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import traverse_util
from jax.sharding import NamedSharding, PartitionSpec as P

from paxlike.core import files as file_io
from paxlike.errors import UserError
from paxlike.layers import quantization
from paxlike.interop import checkpoint, peft, weight_files
from paxlike.trainer import reference
from paxlike.trainer.init_spec import Source, parse

RECORD = 'init_source.json'  # In the job dir: where the run's params came from.
LORA_FIELDS = ('lora_rank', 'lora_alpha', 'lora_targets')  # The run's own, never the source's.


def init_source_tokenizer(init_from: str | None) -> str | None:
  """The tokenizer that comes with the source: an HF dir's tokenizer.json (else tokenizer.model),
  a job's `data.tokenizer` when it names a file; None when there is none."""
  if init_from is None:
    return None
  source = parse(init_from)
  if source.kind == 'hf':  # An adapter's own tokenizer (PEFT saves one beside it), else the base's.
    found = [folder / n for folder in (source.adapter, source.path) if folder is not None
             for n in ('tokenizer.json', 'tokenizer.model') if (folder / n).is_file()]
    return str(found[0]) if found else None
  from paxlike.trainer.job_source import tokenizer_of  # pylint: disable=import-outside-toplevel
  tokenizer = tokenizer_of(_job_config(source).data)
  return tokenizer if isinstance(tokenizer, str) and tokenizer != 'bytes' else None


def model_overrides_from(init_from: str) -> dict[str, Any]:
  """The model fields the source fixes: an HF config.json's (as `checkpoint.config_from_hf`; an
  adapter's base's, with the adapter's LoRA rank, alpha and targets), or the fields the other
  job's config.json sets on its model (its LoRA fields left out)."""
  source = parse(init_from)
  if source.kind == 'hf':
    config = source.path / 'config.json'
    if not config.is_file():
      raise UserError(f'train.init_from={init_from!r}: no config.json in {source.path}')
    hf = checkpoint.read_config(source.path)
    fields = dict(checkpoint.config_from_hf(hf).__arguments__)
    if source.adapter is not None:
      adapter = peft.read_adapter(source.adapter)
      names = checkpoint.name_map(fdl.build(checkpoint.config_from_hf(hf)), hf.get('model_type'))
      fields.update(lora_rank=adapter.rank, lora_alpha=adapter.alpha,
                    lora_targets=peft.targets(adapter, names))
    return fields
  model = _job_config(source).model
  return {k: v for k, v in model.__arguments__.items() if k not in LORA_FIELDS}


def _job_config(source: Source) -> fdl.Buildable:
  from paxlike.config import config_io  # pylint: disable=import-outside-toplevel (imports experiments)
  return config_io.load_file(source.path / 'config.json')


def _flat(tree: Any) -> dict[str, Any]:
  return traverse_util.flatten_dict(tree, sep='/')


def _check_coverage(source: Source, have: set[str], want: dict[str, Any], adapters: set[str]
                    ) -> None:
  """UserError unless the source has every param but adapters, and nothing else."""
  extra = sorted(have - set(want))
  missing = sorted(set(want) - have - adapters)
  if extra or missing:
    raise UserError(f'{source.spec} does not match the model: missing {missing[:3]} '
                    f'({len(missing)} in all), unexpected {extra[:3]} ({len(extra)} in all)')


def _adapters(abstract_params: Any, trainable: Callable[[Any], Any] | None) -> set[str]:
  if trainable is None:
    return set()
  return {name for name, keep in _flat(trainable(abstract_params)).items() if keep}


def load_params(init_from: str, abstract_params: Any, model: Any,
                trainable: Callable[[Any], Any] | None = None) -> dict[str, jax.Array]:
  """{'block_0/attention/query': array placed with its sharding} of every param the source
  gives (all but the adapters). `abstract_params`: the run's unboxed params as sharded
  ShapeDtypeStructs; `trainable`: LoRA's mask, whose leaves the source may lack."""
  source = parse(init_from)
  want, adapters = _flat(abstract_params), _adapters(abstract_params, trainable)
  if source.kind == 'hf':
    return _load_hf(source, want, adapters, model)
  return _load_job(source, want, adapters)


def _put(value: np.ndarray, spec: jax.ShapeDtypeStruct, sharding: Any = None) -> jax.Array:
  """A host tensor on the devices, each device given only its shard."""
  value = value.astype(spec.dtype, copy=False)
  return jax.make_array_from_callback(value.shape, sharding or spec.sharding,
                                      lambda index: value[index])


def _load_hf(source: Source, want: dict[str, Any], adapters: set[str], model: Any
             ) -> dict[str, jax.Array]:
  kind, double = getattr(model, 'base_quantization', 'none'), getattr(model, 'double_quant', True)
  if kind != 'none':  # The checkpoint holds the float kernels of the same model.
    model = model.clone(base_quantization='none')
  header = checkpoint.safetensors_header(source.path)
  tensors = checkpoint.name_map(model, checkpoint.read_config(source.path).get('model_type'),
                               header.keys())
  checkpoint.check_shapes({name: shape for name, (shape, _) in header.items()}, model, tensors)
  scanned = bool(getattr(model, 'scan_layers', False))
  group = model.moe_every if getattr(model, 'num_experts', 0) else 1
  name = lambda path: '/'.join(_scanned_path(path, group) if scanned else path)
  stored = lambda path: ([path + (e,) for e in quantization.entries(kind, double)]
                         if kind != 'none' and quantization.kernel_axes(path[:-1], path[-1])
                         else [path])
  names = {name(p) for t in tensors.values() for path in t.paths for p in stored(path)}
  _check_coverage(source, names, want, adapters)
  adapter = None
  if source.adapter is not None:  # Checked before any data is read.
    adapter = peft.read_adapter(source.adapter)
    peft.check_model(adapter, model, tensors)
    shapes = _unrolled_shapes(want, adapters, model, group)
  read = checkpoint.read_params(header, model, tensors)
  # A quantized base is quantized as it streams in, one tensor at a time.
  pairs = (pair for p, v in read for pair in quantization.quantize_one(p, v, kind, double))
  placed = _place(pairs, want, model, group)
  if adapter is not None:
    dtype = np.dtype(model.param_dtype)
    placed.update(_place(peft.adapter_params(adapter, tensors, shapes, dtype), want, model,
                         group))
  return placed


def _unrolled_shapes(want: dict[str, Any], adapters: set[str], model: Any, group: int
                     ) -> dict[str, tuple[int, ...]]:
  """The adapter params' names and shapes in the unrolled ('block_{i}') tree."""
  if not getattr(model, 'scan_layers', False):
    return {name: tuple(want[name].shape) for name in adapters}
  out = {}
  for i in range(model.num_layers):
    for name in adapters:
      parts = name.split('/')
      if parts[0] != 'blocks':
        out[name] = tuple(want[name].shape)
      elif group == 1 or parts[1] == f'layer_{i % group}':
        out['/'.join((f'block_{i}', *parts[1 + (group > 1):]))] = tuple(want[name].shape[1:])
  return out


def _place(pairs: Iterator[tuple[tuple[str, ...], np.ndarray]], want: dict[str, Any],
           model: Any, group: int) -> dict[str, jax.Array]:
  """Each (unrolled path, value) on the devices with its sharding; a scanned model's layers
  placed one at a time and stacked once all are."""
  scanned = bool(getattr(model, 'scan_layers', False))
  placed: dict[str, jax.Array] = {}
  layers: dict[str, dict[int, jax.Array]] = {}
  steps = model.num_layers // group
  for path, value in pairs:
    if not scanned or not path[0].startswith('block_'):
      placed['/'.join(path)] = _put(value, want['/'.join(path)])
      continue
    name = '/'.join(_scanned_path(path, group))
    spec = want[name]
    layer_sharding = NamedSharding(spec.sharding.mesh, P(*spec.sharding.spec[1:]))
    layers.setdefault(name, {})[int(path[0][6:]) // group] = _put(value, spec, layer_sharding)
    if len(layers[name]) == steps:
      parts = layers.pop(name)
      placed[name] = _stack(tuple(parts[i] for i in range(steps)), spec.sharding)
  return placed


def _scanned_path(path: tuple[str, ...], group: int = 1) -> tuple[str, ...]:
  """block_{i}/... -> blocks/... (a scanned model's stacked layers); with `group` > 1 (a MoE
  model's moe_every) blocks/layer_{i % group}/..."""
  if not path[0].startswith('block_'):
    return path
  if group == 1:
    return ('blocks', *path[1:])
  return ('blocks', f'layer_{int(path[0][6:]) % group}', *path[1:])


def _stack(parts: tuple[jax.Array, ...], sharding: Any) -> jax.Array:
  return _stacker(sharding)(*parts)


@functools.lru_cache(maxsize=64)
def _stacker(sharding: Any) -> Callable[..., jax.Array]:
  """One jitted stack per output sharding, so params of one shape compile it once."""
  return jax.jit(lambda *xs: jnp.stack(xs), out_shardings=sharding)


def _manager(source: Source) -> ocp.CheckpointManager:
  directory = source.path / 'checkpoints'
  if not directory.is_dir():
    raise UserError(f'{source.spec}: no checkpoints directory in {source.path}')
  return ocp.CheckpointManager(
      directory, options=ocp.CheckpointManagerOptions(read_only=True, create=False),
      item_handlers={'state': ocp.PyTreeCheckpointHandler()})


def resolve_step(source: Source, manager: ocp.CheckpointManager) -> int:
  """The source's step: the one asked for, or its latest; committed steps only."""
  steps = sorted(manager.all_steps())
  if not steps:
    raise UserError(f'{source.spec}: no committed checkpoint in {source.path / "checkpoints"}')
  if source.step is not None and source.step not in steps:
    raise UserError(f'{source.spec}: no committed step {source.step} (committed: '
                    f'{", ".join(map(str, steps))})')
  return steps[-1] if source.step is None else source.step


def _load_job(source: Source, want: dict[str, Any], adapters: set[str]) -> dict[str, jax.Array]:
  manager = _manager(source)
  try:
    step = resolve_step(source, manager)
    metadata = manager.item_metadata(step)['state']
    tree = getattr(metadata, 'tree', metadata)
    try:
      # A full fine-tune DPO job's frozen reference copy is not the model's.
      have = reference.without_copy_names(_flat(tree['alg']['params']))
    except (KeyError, TypeError):
      raise UserError(f'{source.spec}: step {step} holds no alg.params') from None
    _check_coverage(source, set(have), want, adapters)
    for name, meta in have.items():
      if tuple(meta.shape) != tuple(want[name].shape):
        raise UserError(f'{name} is {list(meta.shape)} in {source.spec} step {step} but the '
                        f'model needs {list(want[name].shape)}')
    item = {'alg': {'params': traverse_util.unflatten_dict(
        {name: want[name] for name in have}, sep='/')}}
    args = jax.tree.map(lambda s: ocp.ArrayRestoreArgs(sharding=s.sharding, global_shape=s.shape,
                                                       dtype=s.dtype), item)
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item=item, restore_args=args, partial_restore=True)))
  finally:
    manager.close()
  return _flat(restored['state']['alg']['params'])


def _sha256(file: Path) -> str:
  digest = hashlib.sha256()
  with file.open('rb') as f:
    for chunk in iter(lambda: f.read(1 << 24), b''):
      digest.update(chunk)
  return digest.hexdigest()


def source_record(init_from: str) -> dict[str, Any]:
  """What `init_source.json` says: the init_from string, kind, directory, step (jobs), and the
  sha256 of each file read (an HF dir's config.json, index and the safetensors files it is made
  of, and an adapter's as 'adapter/NAME'; every file of the job's step directory) with one
  sha256 over them all; with an adapter, its directory as 'adapter'."""
  source = parse(init_from)
  step = None
  if source.kind == 'hf':
    index = [source.path / weight_files.INDEX]
    index = index if index[0].is_file() else []
    files = weight_files.weight_files(source.path) + index + [source.path / 'config.json']
    root = source.path
  else:
    manager = _manager(source)
    try:
      step = resolve_step(source, manager)
    finally:
      manager.close()
    root = source.path / 'checkpoints' / str(step)
    files = sorted(p for p in root.rglob('*') if p.is_file())
  hashes = {str(f.relative_to(root)): _sha256(f) for f in files if f.is_file()}
  if source.adapter is not None:  # The adapter's files, under its directory's name.
    hashes.update({f'adapter/{n}': _sha256(source.adapter / n)
                   for n in (peft.CONFIG, peft.WEIGHTS)})
  total = hashlib.sha256(''.join(f'{k}:{v}\n' for k, v in hashes.items()).encode()).hexdigest()
  record = {'init_from': init_from, 'kind': source.kind, 'path': str(source.path), 'step': step,
            'files': hashes, 'sha256': total}
  return record if source.adapter is None else {**record, 'adapter': str(source.adapter)}


def write_record(job_dir: Path, record: dict[str, Any]) -> None:
  """`job_dir/init_source.json`, atomically."""
  file_io.write_json(job_dir / RECORD, record)


def nbytes(tree: Any) -> int:
  """Bytes of the arrays in `tree` (for the import's log line)."""
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))
