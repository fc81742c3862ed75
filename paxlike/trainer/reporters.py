"""What a logged row reports besides the step's own metrics: throughput and MFU (from the
family's FLOPs of one step) and, for DP runs, the privacy spent so far."""

from __future__ import annotations

import dataclasses

from paxlike.data.sources import Item
from paxlike.trainer.task import Task
from paxlike.families import family_of
from paxlike.trainer import privacy
from paxlike.trainer import throughput
from paxlike.trainer.program import Program


@dataclasses.dataclass(frozen=True)
class Reporters:
  """The per-row throughput and privacy reports of a placed task."""

  item: Item                      # What items_per_step counts: 'tokens' or 'examples'.
  items_per_step: int
  flops_per_device: float | None  # One step's model FLOPs per device (the family's count).
  num_devices: int
  peak_flops_per_device: float | None  # None where unknown (CPU): no MFU.
  accountant: privacy.Accountant | None = None  # DP runs: the ε spent by each round.

  def row_metrics(self, steps_per_sec: float, step: int) -> dict[str, float]:
    """`{item}_per_sec`, `tflops_per_sec`, `mfu` and, with DP, `dp_epsilon`/`dp_delta`."""
    return {**throughput.throughput_metrics(steps_per_sec, self.items_per_step, self.item,
                                            self.flops_per_device, self.num_devices,
                                            self.peak_flops_per_device),
            **privacy.round_metrics(self.accountant, step)}


def build_reporters(task: Task, program: Program,
                    accountant: privacy.Accountant | None) -> Reporters:
  """The reporters of `task` placed as `program` (`accountant`: `privacy.checked_accountant`)."""
  batches, _ = program.round_specs
  mesh, family = program.mesh, family_of(task.model)
  return Reporters(
      item=family.item, items_per_step=int(family.items_per_step(batches)),
      flops_per_device=family.step_flops(task.model, program.loss_fn, program.boxed_params,
                                         batches, mesh.size),
      num_devices=mesh.devices.size,
      peak_flops_per_device=throughput.peak_flops_per_sec(mesh.devices.flat[0].device_kind),
      accountant=accountant)
