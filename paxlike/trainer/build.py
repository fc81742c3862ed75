"""A task made ready to run (`Trainer`): its placed program, train step, evaluator and row
reporters, each built by its own module.

`setup(task)` is where everything a run can get wrong by configuration fails, before the job
dir is touched; the loop (`loop.py`) then only runs what it returns. Evaluation, decoding and
export ask for less (`train_step=False`, `evaluator=False`) and compile only what they use.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable, NamedTuple

import jax

from paxlike.config import config_io
from paxlike.core import partitioning, program_store
from paxlike.errors import UserError
from paxlike.federated import chunking
from paxlike.layers.lora import LoraSpec
from paxlike.trainer.task import Task
from paxlike.trainer import objectives, privacy
from paxlike.trainer.evaluator import Evaluator, build_evaluator
from paxlike.trainer.program import Kept, Program, compile_train_step, place
from paxlike.trainer.reporters import Reporters, build_reporters
from paxlike.trainer.train_state import TrainState


@dataclasses.dataclass(frozen=True)
class Trainer:
  """A task with what runs it: `program` (mesh, shardings, init, abstract state, data block),
  `step` (the compiled train step) with its `reporters` (throughput and privacy of each row),
  both None when not asked for, `evaluator` (None when not asked for), and the task's
  `objective` (objectives.for_task)."""

  task: Task
  program: Program
  step: Callable[..., tuple[TrainState, dict]] | None
  evaluator: Evaluator | None
  reporters: Reporters | None
  objective: objectives.Objective


class KeptAs(NamedTuple):
  """What `setup` keeps a task's programs under: what built it."""

  config: str  # The config's `config_io.trace_key`.
  data: dict[str, str] | None  # The data's fingerprint (what a job dir records of it).


def kept_as(cfg: Any, task: Task) -> KeptAs:
  """What `setup` keeps the programs of `task` (built from `cfg`) under, the data prepared
  first."""
  task.data.prepare()
  return KeptAs(config_io.trace_key(cfg), task.data.fingerprint())


def setup(task: Task, *, train_step: bool = True, evaluator: bool = True,
          kept_as: KeptAs | None = None) -> Trainer:
  """Places `task` on its mesh and compiles its init, its train step and row reporters
  (`train_step`) and its eval step (`evaluator`), all from `task` with its DP aggregator's
  divisor bound to the data's cohort (privacy.cohort_bound; `Trainer.task`). The data is
  prepared first (its one read of the corpus or dataset), and a run over its privacy budget is
  refused before anything is compiled. With `kept_as` (what built `task`), the programs are
  kept compiled beside the compilation cache, and a run that another built the same way
  compiles none of them."""
  if train_step:
    _check_trainable(task)
  task.data.prepare()
  task = privacy.cohort_bound(task)
  accountant = privacy.checked_accountant(task)
  store = None if kept_as is None else program_store.current(program_store.TRAIN_DIRNAME)
  kept = None if store is None else Kept(store, kept_as)
  program = place(task, kept)
  objective = objectives.of_task(task)
  step, trained = None, program  # An objective's own step (GRPO's samples first) may place
  if train_step:                 # its batches by a program of its own.
    step, trained = (objective.train_step(task, program) if objective.train_step else
                     (_fitting_round(task, program, kept), program))
  return Trainer(task=task, program=program, step=step,
                 evaluator=build_evaluator(task, program, kept) if evaluator else None,
                 reporters=build_reporters(task, trained, accountant) if train_step else None,
                 objective=objective)


def _check_trainable(task: Task) -> None:
  """UserError for a quantized base with no adapters to train (it is frozen)."""
  kind = getattr(task.model, 'base_quantization', 'none')
  if kind != 'none' and not LoraSpec.of(task.model).enabled:
    raise UserError(f'model.base_quantization={kind!r} freezes the base: set model.lora_rank '
                    '> 0 to train LoRA adapters over it')


_ADVICE = ('lower data.batch_size, set model.remat_policy=\'full\', shrink the optimizer '
           'state (--fdl_fiddler=bf16_moments or adafactor), or for a fine-tune train LoRA '
           'over a quantized base (model.lora_rank=16, model.base_quantization=\'nf4\')')


def advice(task: Task) -> str:
  """What would make `task`'s step fit: `_ADVICE`, and first, for a federated round that trains
  more than one client at a time, training fewer."""
  clients = getattr(task.data, 'clients_per_round', 1)
  configured = chunking.configured_client_chunk(task.algorithm)
  at_once = min(clients, configured or chunking.clients_fitted() or _platform_chunk(task)
                or clients)
  if at_once <= 1:
    return _ADVICE
  return (f'train fewer of the round\'s {clients} clients at a time than {at_once} '
          f'(algorithm.client_chunk), ' + _ADVICE)


def _fitting_round(task: Task, program: Program, kept: Kept | None) -> Any:
  """`_fitting(compile_train_step, ...)`; for a federated round whose config leaves
  `algorithm.client_chunk` unset where the platform would train the whole cohort at once, a
  refusal for memory retries the round with fewer clients at a time (each next smaller divisor
  of the cohort, by XLA's own figure, said on stderr) until one fits or one client is refused."""
  chunk = None
  while True:
    try:
      with chunking.clients_that_fit(chunk):
        return _fitting(compile_train_step, task, program,
                        kept if kept is None or chunk is None else
                        Kept(kept.store, (kept.key, ('client_chunk', chunk))))
    except DoesNotFit as refused:
      fewer = _fewer_clients(task, chunk)
      if fewer is None:
        raise
      reason = str(refused).split('; ')[0]
      print(f'federated rounds: {chunk or task.data.clients_per_round} clients at a time do '
            f'not fit ({reason}); trying {fewer}', file=sys.stderr, flush=True)
      chunk = fewer


def _fewer_clients(task: Task, chunk: int | None) -> int | None:
  """The next smaller divisor of the cohort than `chunk` (None: the whole cohort) to train at a
  time, where setup chooses that (see `_fitting_round`); None where it does not or none is left."""
  cohort = getattr(task.data, 'clients_per_round', 1)
  if (cohort <= 1 or chunking.configured_client_chunk(task.algorithm) is not None
      or _platform_chunk(task) is not None):
    return None
  if _clients_axis(task) > 1:
    return None  # The mesh splits the cohort: chunks would run one after another, gathered.
  return next((d for d in range((chunk or cohort) - 1, 0, -1) if cohort % d == 0), None)


def _clients_axis(task: Task) -> int:
  """The devices the task's mesh splits a round's cohort over."""
  mesh = dict(zip(task.mesh.axes, partitioning.mesh_shape(task.mesh, jax.device_count())))
  return mesh.get(partitioning.CLIENTS_AXIS, 1)


def _platform_chunk(task: Task) -> int | None:
  """The clients at a time this platform trains where the config leaves it unset (None: all)."""
  return chunking.default_client_chunk(jax.default_backend(), _clients_axis(task))


def memory_budget(task: Task) -> tuple[float | None, str]:
  """The bytes a device may use (`train.memory_budget_gb`, else the device's `bytes_limit`
  where JAX reports one; None on XLA:CPU) and where that number came from."""
  if task.train.memory_budget_gb is not None:
    return task.train.memory_budget_gb * 1e9, 'train.memory_budget_gb'
  stats = jax.local_devices()[0].memory_stats() or {}
  limit = stats.get('bytes_limit')
  return (float(limit), f'{jax.local_devices()[0].device_kind} bytes_limit') if limit else (None, '')


def compiled_bytes(step: Any) -> float | None:
  """XLA's per-device figure for a compiled step: its peak where the backend computes one
  (TPU, GPU), else arguments + outputs − aliased + temporaries (XLA:CPU, whose
  `peak_memory_in_bytes` counts only the arguments); None when the executable cannot say."""
  try:
    stats = step.memory_analysis()
  except (AttributeError, NotImplementedError, RuntimeError):
    return None
  if stats is None:
    return None
  whole = (stats.argument_size_in_bytes + stats.output_size_in_bytes
           - stats.alias_size_in_bytes + stats.temp_size_in_bytes)
  peak = getattr(stats, 'peak_memory_in_bytes', 0) or 0
  return float(peak) if jax.default_backend() != 'cpu' and peak > 0 else float(whole)


class DoesNotFit(UserError):
  """A train step refused for memory: XLA's figure over the budget, or out of it compiling."""


def _fitting(compile_step: Callable[..., Any], task: Task, program: Program,
             kept: Kept | None) -> Any:
  """`compile_step(task, program, kept)`, refused (a UserError naming both numbers) when XLA
  says the step needs more memory per device than the budget (`memory_budget`), or runs out of
  it while compiling (a TPU's compiler refuses such a program itself)."""
  try:
    step = compile_step(task, program, kept)
  except jax.errors.JaxRuntimeError as error:
    first = str(error).splitlines()[0] if str(error) else ''
    if 'RESOURCE_EXHAUSTED' in first or 'out of memory' in first.lower():
      raise DoesNotFit(f'the train step does not fit in device memory: {first}; {advice(task)}'
                       ) from None
    raise
  budget, source = memory_budget(task)
  needed = compiled_bytes(step)
  if budget is not None and needed is not None and needed > budget:
    raise DoesNotFit(f'the train step needs {needed / 1e9:.2f} GB per device (XLA\'s compiled '
                     f'figure) but {source} allows {budget / 1e9:.2f} GB; {advice(task)}')
  return step
