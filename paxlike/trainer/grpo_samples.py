"""What a GRPO run sampled, beside its rows: `DIR/samples.jsonl`.

At each step that writes a row to metrics.jsonl (every train.log_every and train.eval_every
steps and the last), the step's first `loss.num_completions_to_log` completions (whole groups
first: prompt 0's G completions, then prompt 1's...) are appended, one JSON object each:

  {"step": 4, "row": 17, "prompt": "12+3=", "completion": "15", "reward": 1.0,
   "advantage": 0.93, "rewards": {"exact_match": 1.0, "regex_format": 0.0}}

`row` is the prompt's row in the prompt data, `reward` the weighted sum of the reward
functions (`rewards`: each function's, where there are several) and `advantage` what the
update trained on (grpo_loss.group_advantages). Bounded: a row holds one prompt of at most
data.seq_len tokens and one completion of at most loss.max_completion_length, and a step
whose rows would take the file past MAX_BYTES writes none (a line on stderr says so once).

A step's rows go out in one write, before the step's checkpoint. On resume from step c the
file keeps the complete rows of steps <= c and nothing else (a torn last line, and the rows of
steps sampled after c, are dropped: those steps run again and write the same rows), so a run
killed at any moment and resumed has the rows of an uninterrupted run. Only the primary
process writes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from paxlike.trainer.summaries import status, truncate_after

FILE = 'samples.jsonl'
MAX_BYTES = 16 * 2**20  # The file's cap: about 30,000 rows of short arithmetic completions.


class Samples(NamedTuple):
  """A step's completions, scored: N = B * G of each, prompt i's G in rows i*G .. i*G+G-1."""

  rows: list[int]                 # The prompt data's row of each completion's prompt.
  prompts: list[str]
  completions: list[str]
  rewards: np.ndarray             # float32 [N]: the weighted sum.
  each: dict[str, np.ndarray]     # Each reward function's float32 [N].


def sample_rows(step: int, samples: Samples, advantages: np.ndarray, limit: int
                ) -> list[dict[str, Any]]:
  """The JSON rows of the first `limit` completions of step `step` (module docstring)."""
  out = []
  for i in range(min(limit, len(samples.completions))):
    row = {'step': step, 'row': samples.rows[i], 'prompt': samples.prompts[i],
           'completion': samples.completions[i], 'reward': float(samples.rewards[i]),
           'advantage': float(advantages[i])}
    if len(samples.each) > 1:
      row['rewards'] = {name: float(values[i]) for name, values in samples.each.items()}
    out.append(row)
  return out


class SampleLog:
  """Appends each logged step's samples to DIR/samples.jsonl (module docstring). Closed (it
  writes nothing) until `open` says where and from which step the loop runs."""

  def __init__(self, train: Any, limit: int, max_bytes: int = MAX_BYTES):
    self.train, self.limit, self.max_bytes = train, limit, max_bytes
    self.path: Path | None = None  # Where this process writes: the primary's file, once open.
    self.opened = False
    self.step = 0  # The step last counted (`next_step`).
    self._full = False

  def open(self, job_dir: Path, start: int, primary: bool = True) -> None:
    """Counts steps from `start` (the restored step), and on the primary process keeps only
    the file's complete rows of steps <= start."""
    self.step, self.opened = start, True
    self.path = job_dir / FILE if primary and self.limit > 0 else None
    if self.path is not None:
      if torn := truncate_after(self.path, start):
        status(f'dropped {torn} torn line{"s" if torn > 1 else ""} of {FILE}, cut short by a '
               'crash')

  def next_step(self) -> int:
    """The step now running (the loop runs start + 1, start + 2, ...)."""
    self.step += 1
    return self.step

  def due(self, step: int) -> bool:
    """Whether step `step` logs samples (on every process alike: they gather the
    advantages): open, rows asked for, and a step with a row in metrics.jsonl."""
    cfg = self.train
    return self.opened and self.limit > 0 and (
        step % cfg.log_every == 0 or step % cfg.eval_every == 0 or step == cfg.num_steps)

  def write(self, step: int, samples: Samples, advantages: np.ndarray) -> None:
    """Appends step `step`'s rows in one write (the primary process; the others write
    nothing), unless that would pass `max_bytes`."""
    if self.path is None:
      return
    data = ''.join(json.dumps(r) + '\n'
                   for r in sample_rows(step, samples, advantages, self.limit)).encode()
    size = self.path.stat().st_size if self.path.exists() else 0
    if size + len(data) > self.max_bytes:  # Decided by the file alone, as a resumed run's.
      if not self._full:
        status(f'{FILE} is at its cap of {self.max_bytes:,} bytes: a step whose samples would '
               'pass it writes none')
      self._full = True
      return
    fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
      view = memoryview(data)
      while view:  # A regular file takes it whole; a short write continues where it stopped.
        view = view[os.write(fd, view):]
    finally:
      os.close(fd)
