"""Throughput and model FLOPs utilisation, from the family's FLOPs of one step
(paxlike.families) and the chip's peak."""

from __future__ import annotations

# Dense bf16 peak FLOP/s per chip, by a substring of `jax.Device.device_kind` (first match wins).
PEAK_FLOPS_PER_SEC: tuple[tuple[str, float], ...] = (
    ('v5 lite', 197e12),   # TPU v5e
    ('v5e', 197e12),
    ('v5p', 459e12),
    ('v6', 918e12),        # TPU v6e (Trillium)
    ('v4', 275e12),
    ('v5', 459e12),        # 'TPU v5' is v5p
    ('h200', 989e12),
    ('h100', 989e12),
    ('a100', 312e12),
)


def peak_flops_per_sec(device_kind: str) -> float | None:
  """Peak dense bf16 FLOP/s of one chip, or None when unknown (e.g. CPU)."""
  kind = device_kind.lower()
  if 'cpu' in kind:
    return None
  return next((peak for key, peak in PEAK_FLOPS_PER_SEC if key in kind), None)


def throughput_metrics(steps_per_sec: float, items_per_step: int, item_name: str,
                       flops_per_device: float | None, num_devices: int,
                       peak_per_device: float | None) -> dict[str, float]:
  """`{item}_per_sec`, `tflops_per_sec` (all devices) and `mfu` (when the peak is known)."""
  out = {f'{item_name}_per_sec': steps_per_sec * items_per_step}
  if flops_per_device:
    per_device = flops_per_device * steps_per_sec
    out['tflops_per_sec'] = per_device * num_devices / 1e12
    if peak_per_device:
      out['mfu'] = per_device / peak_per_device
  return out
