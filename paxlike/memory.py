"""Per-device training memory of a task, as its model's family estimates it (the LM estimate
and its method are in paxlike/families/lm_memory.py; classifiers have none)."""

from __future__ import annotations

from typing import Any

from paxlike.families import family_of
# The LM estimate, under the names its callers import from here.
from paxlike.families.lm_memory import Estimate, activation_bytes_per_token, estimate

__all__ = ['Estimate', 'activation_bytes_per_token', 'estimate', 'summary']


def summary(task: Any) -> str:
  """Estimate lines for `--mode=print_config` ('' for a family without an estimate)."""
  return family_of(task.model).memory_summary(task)
