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


# HBM bandwidth per chip in bytes/s, matched the same way (a batch-1 decode token reads every
# parameter once, so parameter bytes over this is its roofline time).
HBM_BYTES_PER_SEC: tuple[tuple[str, float], ...] = (
    ('v5 lite', 819e9),   # TPU v5e
    ('v5e', 819e9),
    ('v5p', 2765e9),
    ('v6', 1640e9),       # TPU v6e (Trillium)
    ('v4', 1200e9),
    ('v5', 2765e9),       # 'TPU v5' is v5p
    ('h200', 4.8e12),
    ('h100', 3.35e12),
    ('a100', 2.0e12),
)


def _by_kind(table: tuple[tuple[str, float], ...], device_kind: str) -> float | None:
  """The first value of `table` whose key is in `device_kind` (None on CPU or unknown)."""
  kind = device_kind.lower()
  if 'cpu' in kind:
    return None
  return next((value for key, value in table if key in kind), None)


def peak_flops_per_sec(device_kind: str) -> float | None:
  """Peak dense bf16 FLOP/s of one chip, or None when unknown (e.g. CPU)."""
  return _by_kind(PEAK_FLOPS_PER_SEC, device_kind)


def hbm_bytes_per_sec(device_kind: str) -> float | None:
  """HBM bandwidth of one chip in bytes/s, or None when unknown (e.g. CPU)."""
  return _by_kind(HBM_BYTES_PER_SEC, device_kind)


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
