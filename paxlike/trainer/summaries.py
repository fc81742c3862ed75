"""Run outputs: `metrics.jsonl`, `eval_clients.jsonl` (per-client held-out metrics at each
eval), TensorBoard event files and the progress line.

Only the primary process writes. On resume, rows after the restored step are dropped, so a run
killed after logging but before checkpointing rewrites those rows instead of duplicating them.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from tensorboardX import SummaryWriter

from paxlike.core import files as file_io


def scalars(metrics: Mapping[str, Any]) -> dict[str, float | int]:
  """Host scalars from a metrics dict: ints stay ints, the rest become Python floats."""
  out = {}
  for key, value in metrics.items():
    value = np.asarray(value)
    out[key] = int(value) if np.issubdtype(value.dtype, np.integer) else float(value)
  return out


def truncate_after(path: Path, step: int) -> int:
  """Keeps the well-formed rows of a metrics.jsonl whose step is at most `step`; returns how
  many torn rows (cut short by a kill mid-write) it dropped."""
  if not path.exists():
    return 0
  kept, torn = [], 0
  for line in path.read_text().splitlines():
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      torn += 1
      continue
    if row.get('step', math.inf) <= step:
      kept.append(line)
  # Whole or not at all: a kill mid-write must not lose the rows being kept.
  file_io.write_text(path, ''.join(line + '\n' for line in kept))
  return torn


class RunWriter:
  """Writes one metrics row per logged step, TensorBoard scalars, and a progress line."""

  def __init__(self, job_dir: Path, start_step: int, num_steps: int, primary: bool = True):
    self.primary = primary
    self.num_steps = num_steps
    self._last = (start_step, time.perf_counter())
    self._metrics_path = job_dir / 'metrics.jsonl'
    self._clients_path = job_dir / 'eval_clients.jsonl'
    if primary:
      for path in (self._metrics_path, self._clients_path):
        if torn := truncate_after(path, start_step):
          status(f'dropped {torn} torn line{"s" if torn > 1 else ""} of {path.name}, cut short by a crash')
      self._file = self._metrics_path.open('a')
      self._tb = {split: SummaryWriter(str(job_dir / 'summaries' / split), purge_step=start_step + 1)
                  for split in ('train', 'eval')}

  def steps_per_sec(self, step: int) -> float:
    """Steps per second since the previous call (or since the start)."""
    last_step, last_time = self._last
    now = time.perf_counter()
    self._last = (step, now)
    return (step - last_step) / max(now - last_time, 1e-9)

  def write(self, step: int, train: Mapping[str, Any], evals: Mapping[str, Any] | None = None,
            clients: Mapping[str, Mapping[str, float]] | None = None) -> dict:
    """Writes the row for `step` (and its per-client eval table, if any) and returns the row."""
    row = {'step': step, **scalars(train)}
    row.update({f'eval_{k}': v for k, v in scalars(evals or {}).items()})
    if not self.primary:
      return row
    if clients:
      with self._clients_path.open('a') as f:
        f.write(json.dumps({'step': step, 'clients': clients}) + '\n')
    self._file.write(json.dumps(row) + '\n')
    self._file.flush()
    for key, value in row.items():
      if key == 'step':
        continue
      split, name = ('eval', key[5:]) if key.startswith('eval_') else ('train', key)
      self._tb[split].add_scalar(name, value, step)
    status(progress_line(row, self.num_steps))
    return row

  def close(self) -> None:
    if self.primary:
      self._file.close()
      for tb in self._tb.values():
        tb.close()


def status(message: str) -> None:
  """One line of progress on stderr (absl's INFO logging is off by default: Orbax is chatty)."""
  print(message, file=sys.stderr, flush=True)


def progress_line(row: Mapping[str, Any], num_steps: int) -> str:
  """`step 100/1000 (10%)  loss 2.3100  eval_loss 2.4000  12.50 steps/s eta 1m12s  mfu 41.0%`;
  `loss` is the row's: the mean over the steps since the previous row."""
  step = row['step']
  parts = [f'step {step}/{num_steps} ({100 * step // num_steps}%)', f"loss {row['loss']:.4f}"]
  if 'eval_loss' in row:
    parts.append(f"eval_loss {row['eval_loss']:.4f}")
  rate = row.get('steps_per_sec')
  if rate:
    parts.append(f'{rate:.2f} steps/s eta {format_seconds((num_steps - step) / rate)}')
  if 'mfu' in row:  # Only where the device's peak is known (not on CPU): else the raw rate.
    parts.append(f"mfu {100 * row['mfu']:.1f}%")
  elif 'tflops_per_sec' in row:
    parts.append(f"{row['tflops_per_sec']:.3g} TFLOP/s")
  return '  '.join(parts)


def format_seconds(seconds: float) -> str:
  minutes, secs = divmod(int(round(seconds)), 60)
  hours, minutes = divmod(minutes, 60)
  return f'{hours}h{minutes:02d}m' if hours else f'{minutes}m{secs:02d}s'
