"""A GRPO step as the loop runs it (`GrpoStep`): sample, score, update.

The loop hands it step s's prompt batch (PromptData), the state and the step's key, as it hands
any train step its round. It then
  1. samples G completions of each prompt from the current params with the decoder
     (paxlike/decode/engine.py: one jitted prefill and one jitted while_loop with a KV cache,
     on the training mesh; the only host round trip is the finished tokens), from the key
     `jax.random.key(sampling_seed(rng))`, a function of (seed, s), so a resumed run draws
     the same completions: `--mode=decode --decode_seed=<that seed>` on the same prompts
     continues them alike;
  2. scores the completion texts with the reward functions on the host (rewards.score: a
     function that fails is a RunFailure here, before anything of the step is kept);
  3. builds the prompt + completion batch (grpo.train_batch), adds the advantages and the
     log-probabilities the loss needs (grpo.scorer, jitted) and takes the update: the task's
     compiled train step over that batch, `loss.num_iterations` optimizer updates (all of
     them in the step: the learning-rate schedule counts each, so with mu > 1 it runs mu times
     as fast as train.num_steps says);
  4. at a step with a row, appends the first completions with their rewards and advantages to
     DIR/samples.jsonl (grpo_samples.py), once the loop has opened `GrpoStep.log` there.
On several processes (jax.distributed) every process runs the host side whole and alike: it
gathers the step's prompts, samples every completion on its own devices (the decoder on this
process's part of the mesh, from the params gathered to it: a model too large for one host's
devices does not sample this way), scores them all, and places its part of the training batch;
the update runs on the whole mesh. Only the primary process writes samples.jsonl.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np
from jax.sharding import Mesh

from paxlike.core import partitioning
from paxlike.decode import engine
from paxlike.trainer import grpo, grpo_samples, rewards
from paxlike.trainer.program import Program, compile_train_step, placed_spec
from paxlike.trainer.task import Task

SAMPLING_STREAM = 1  # fold_in(step key, this): the sampling seed's own stream.


def sampling_seed(rng: jax.Array) -> int:
  """The decoder seed of the step whose key is `rng` (fold_in(key(train.seed), step))."""
  return int(jax.random.randint(jax.random.fold_in(rng, SAMPLING_STREAM), (), 0, 2**31 - 1))


def step_sampling_seed(seed: int, step: int) -> int:
  """`sampling_seed` of step `step` of a run with train.seed `seed`."""
  return sampling_seed(jax.random.fold_in(jax.random.key(seed), step))


def gathered(tree: Any) -> Any:
  """Host numpy copies of the global arrays of `tree`, whole on every process."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  return multihost_utils.process_allgather(tree, tiled=True)


def local_decoding(mesh: Mesh, params: Any) -> tuple[Mesh, Any]:
  """(mesh, params) the decoder runs on: the training mesh and params in one process; on
  several, this process's devices of the mesh (on its first axis) and the params gathered."""
  if jax.process_count() == 1:
    return mesh, params
  mine = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
  shape = (len(mine),) + (1,) * (len(mesh.axis_names) - 1)
  return Mesh(np.asarray(mine).reshape(shape), mesh.axis_names), gathered(params)


def sample(task: Task, mesh: Any, rules: Any, params: Any, prompts: list[np.ndarray],
           seed: int) -> list[np.ndarray]:
  """Each prompt's G completions (rows i*G .. i*G+G-1 for prompt i), int32 ids cut after the
  stop token, sampled as `engine.generate` samples from key(seed)."""
  loss, data = task.loss, task.data
  repeated = [p for p in prompts for _ in range(loss.num_generations)]
  new = loss.max_completion_length
  cache_len = engine.cache_len_for(task.model, max(map(len, repeated)), new)
  mesh, params = local_decoding(mesh, params)
  with jax.set_mesh(mesh):  # LoRA's merge too, on the decoder's devices.
    return engine.generate(task.model, params, repeated, max_new_tokens=new,
                           temperature=loss.temperature, top_k=loss.top_k, top_p=loss.top_p,
                           eos_id=data.stop_id(), seed=seed, cache_len=cache_len,
                           pad_id=data.loaded_tokenizer.pad_id or 0, mesh=mesh, rules=rules)


def completion_texts(tokenizer: Any, completions: list[np.ndarray], stop: int) -> list[str]:
  """The text of each completion, without the stop token it ended at."""
  cut = lambda row: row[:-1] if len(row) and row[-1] == stop else row
  return [tokenizer.decode(cut(row).tolist()) for row in completions]


def row_fields(data: Any, rows: np.ndarray, repeat: int) -> dict[str, list[Any]]:
  """The prompt rows' fields (every key any of them has; None where one lacks it; `answer`
  for the answer field), each value repeated for the row's `repeat` completions."""
  fields = [data.rows.fields[r] for r in rows.tolist()]
  skip = {data.prompt_field, data.messages_field}
  keys = sorted({k for f in fields for k in f} - skip)
  out = {k: [f.get(k) for f in fields for _ in range(repeat)] for k in keys}
  if data.answer_field:
    out['answer'] = [data.rows.answers[r] for r in rows.tolist() for _ in range(repeat)]
  return out


def sample_metrics(total: np.ndarray, each: dict[str, np.ndarray], lengths: np.ndarray
                   ) -> dict[str, np.ndarray]:
  """The step's reward statistics (grpo.SAMPLE_METRICS; `reward/<fn>`: each function's mean
  where there are several), float32."""
  f32 = np.float32
  out = {'reward': f32(total.mean()), 'reward_std': f32(total.std()),
         'reward_max': f32(total.max()), 'completion_length': f32(lengths.mean())}
  if len(each) > 1:
    out.update({f'reward/{name}': f32(values.mean()) for name, values in each.items()})
  return out


@dataclasses.dataclass(frozen=True)
class GrpoStep:
  """`step(state, batches, weights, rng) -> (state, metrics)` of a GRPO task (module
  docstring): what the loop calls in place of a compiled train step."""

  task: Task
  program: Program                          # The training batch's program (train_program).
  score: Callable[[Any, dict], dict]        # Jitted grpo.scorer.
  update: Callable[..., tuple[Any, dict]]   # The compiled train step.
  log: grpo_samples.SampleLog               # samples.jsonl, once the loop opens it.

  def prompts(self, batches: dict) -> tuple[list[np.ndarray], np.ndarray]:
    """(each prompt's ids, their rows) of a placed prompt batch, on the host."""
    host = gathered({k: batches[k] for k in ('inputs', 'lengths', 'row')})
    host = {k: np.asarray(v)[0, 0] for k, v in host.items()}
    return [row[:n] for row, n in zip(host['inputs'], host['lengths'].tolist())], host['row']

  def sample(self, params: Any, prompts: list[np.ndarray], rng: jax.Array) -> list[np.ndarray]:
    """The prompts' G completions each, from the step key `rng` (module docstring)."""
    return sample(self.task, self.program.mesh, self.program.rules, params, prompts,
                  sampling_seed(rng))

  def rewarded(self, rows: np.ndarray, completions: list[np.ndarray]
               ) -> grpo_samples.Samples:
    """The completions of the prompts of data rows `rows` (G each) as text, scored."""
    loss, data = self.task.loss, self.task.data
    g = loss.num_generations
    texts = completion_texts(data.loaded_tokenizer, completions, data.stop_id())
    prompt_texts = [data.rows.prompts[r] for r in rows.tolist() for _ in range(g)]
    total, each = rewards.score(loss.reward_fns, loss.reward_weights, prompt_texts, texts,
                                row_fields(data, rows, g))
    return grpo_samples.Samples([r for r in rows.tolist() for _ in range(g)], prompt_texts,
                                texts, total, each)

  def placed_batch(self, prompts: list[np.ndarray], completions: list[np.ndarray],
                   samples: grpo_samples.Samples) -> tuple[dict, dict[str, np.ndarray]]:
    """(the rewarded training batch on the mesh, the sample metrics) of the completions."""
    loss, data = self.task.loss, self.task.data
    width = data.seq_len + loss.max_completion_length - 1
    batch = grpo.train_batch([p for p in prompts for _ in range(loss.num_generations)],
                             completions, width, data.loaded_tokenizer.pad_id or 0)
    batch = {**{k: v[None, None] for k, v in batch.items()},
             'rewards': samples.rewards[None, None]}
    placed = partitioning.host_to_global(batch, partitioning.round_batch_sharding(
        self.program.mesh))
    lengths = np.asarray([len(c) for c in completions], np.float32)
    return placed, sample_metrics(samples.rewards, samples.each, lengths)

  def training_batch(self, prompts: list[np.ndarray], rows: np.ndarray,
                     completions: list[np.ndarray]) -> tuple[dict, dict[str, np.ndarray]]:
    """(the rewarded training batch on the mesh, the sample metrics) of the completions."""
    return self.placed_batch(prompts, completions, self.rewarded(rows, completions))

  def scored_samples(self, params: Any, batches: dict, rng: jax.Array
                     ) -> tuple[dict, dict[str, np.ndarray], grpo_samples.Samples]:
    """(the scored training batch on the mesh, the sample metrics, the samples) of prompt
    `batches`."""
    prompts, rows = self.prompts(batches)
    completions = self.sample(params, prompts, rng)
    samples = self.rewarded(rows, completions)
    placed, metrics = self.placed_batch(prompts, completions, samples)
    return self.score(params, placed), metrics, samples

  def rollout(self, params: Any, batches: dict, rng: jax.Array
              ) -> tuple[dict, dict[str, np.ndarray]]:
    """(the scored training batch on the mesh, the sample metrics) of prompt `batches`."""
    return self.scored_samples(params, batches, rng)[:2]

  def __call__(self, state: Any, batches: dict, weights: jax.Array, rng: jax.Array
               ) -> tuple[Any, dict]:
    scored, metrics, samples = self.scored_samples(state.alg.params, batches, rng)
    step = self.log.next_step()
    if self.log.due(step):
      self.log.write(step, samples, np.asarray(gathered(scored['advantages']))[0, 0])
    state, update_metrics = self.update(state, scored, weights, rng)
    return state, {**update_metrics, **metrics}


def train_program(task: Task, program: Program) -> Program:
  """`program` with a training batch's specs (B * G sequences of prompt + completion, scored)
  and the algorithm repeated loss.num_iterations times (grpo.repeated)."""
  loss, data = task.loss, task.data
  n, width = data.batch_size * loss.num_generations, data.seq_len + loss.max_completion_length - 1
  sharding = partitioning.round_batch_sharding(program.mesh)
  raw = {'inputs': np.zeros((1, 1, n, width), np.int32),
         'targets': np.zeros((1, 1, n, width), np.int32),
         'mask': np.zeros((1, 1, n, width), np.float32), 'rewards': np.zeros((1, 1, n), np.float32)}
  scored = jax.eval_shape(grpo.scorer(task.model, loss), program.abstract_params,
                          jax.tree.map(lambda x: placed_spec(x, sharding), raw))
  specs = jax.tree.map(lambda x: placed_spec(x, sharding), scored)
  return dataclasses.replace(
      program, algorithm=grpo.repeated(program.algorithm, loss.num_iterations),
      round_specs=(specs, program.round_specs[1]), round_shape=(1, 1, n),
      block=partitioning.process_block(sharding, (1, 1, n)))


def build(task: Task, program: Program) -> tuple[GrpoStep, Program]:
  """The GRPO step of `task` placed as `program`, and its training program (for reporters)."""
  trained = train_program(task, program)
  with jax.set_mesh(program.mesh):
    score = jax.jit(grpo.scorer(task.model, task.loss))
  log = grpo_samples.SampleLog(task.train, task.loss.num_completions_to_log)
  return GrpoStep(task, trained, score, compile_train_step(task, trained), log), trained
