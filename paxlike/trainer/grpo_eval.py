"""GRPO's held-out reward: what the policy earns on prompts it never trained on.

At each eval the held-out prompts that `eval_loss` scores (PromptData's eval rows: the
answers' NLL) are also completed greedily (temperature 0, the decoder GRPO samples with, up to
`loss.max_completion_length` new tokens, stopping at the data's stop token), and the training
reward functions score those completions with the prompt rows' fields. The row logs their mean
as `eval_reward` (the weighted sum, as `reward`), and `eval_reward/<fn>` per function where
there are several. Greedy, so it is a function of the params alone: a resumed run and
`--mode=eval` log the same numbers.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from paxlike.decode import engine
from paxlike.trainer import grpo_step, rewards
from paxlike.trainer.program import Program
from paxlike.trainer.task import Task


def held_out_rows(data: Any) -> np.ndarray:
  """int64: the held-out prompt rows the eval batches hold (PromptData's eval rows, in batch
  order, without the padding slots)."""
  picked = np.asarray(data._eval_rows[0]).ravel()  # pylint: disable=protected-access
  return picked[picked >= 0]


def greedy_completions(task: Task, program: Program, params: Any, rows: np.ndarray
                       ) -> list[np.ndarray]:
  """Each held-out row's greedy completion (int32 ids, cut after the stop token)."""
  data, loss = task.data, task.loss
  prompts = [data.rows.ids[r] for r in rows.tolist()]
  new = loss.max_completion_length
  mesh, params = grpo_step.local_decoding(program.mesh, params)  # Several processes: each whole.
  with jax.set_mesh(mesh):  # LoRA's merge too, on the decoder's devices.
    return engine.generate(task.model, params, prompts, max_new_tokens=new, temperature=0.0,
                           eos_id=data.stop_id(), pad_id=data.loaded_tokenizer.pad_id or 0,
                           cache_len=engine.cache_len_for(task.model, max(map(len, prompts)),
                                                          new),
                           mesh=mesh, rules=program.rules, batch_size=data.eval_batch_size)


def reward_metrics(total: np.ndarray, each: dict[str, np.ndarray]) -> dict[str, float]:
  """`reward` (the mean of the weighted sums) and, with several functions, `reward/<fn>`."""
  out = {'reward': float(np.mean(total, dtype=np.float32))}
  if len(each) > 1:
    out.update({f'reward/{name}': float(np.mean(values, dtype=np.float32))
                for name, values in each.items()})
  return out


def held_out_reward(task: Task, program: Program) -> Callable[[Any], dict[str, float]]:
  """`fn(params) -> {'reward': ..., ...}`: the mean reward of greedy completions of the
  held-out prompts (module docstring)."""
  data, loss = task.data, task.loss
  rows = held_out_rows(data)

  def evaluate(params: Any) -> dict[str, float]:
    completions = greedy_completions(task, program, params, rows)
    texts = grpo_step.completion_texts(data.loaded_tokenizer, completions, data.stop_id())
    prompts = [data.rows.prompts[r] for r in rows.tolist()]
    total, each = rewards.score(loss.reward_fns, loss.reward_weights, prompts, texts,
                                grpo_step.row_fields(data, rows, 1))
    return reward_metrics(total, each)
  return evaluate
