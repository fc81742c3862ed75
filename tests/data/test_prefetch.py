"""The background prefetcher returns exactly what direct calls return."""

import threading
import time

import numpy as np
import pytest

from paxlike.data import Prefetcher


def batch(step: int) -> np.ndarray:
  return np.random.default_rng(step).normal(size=(4, 3))


def test_prefetcher_matches_direct_calls_in_and_out_of_order():
  with Prefetcher(batch, start=5) as pre:
    for step in (5, 6, 7, 3, 4, 10):
      assert np.array_equal(pre.get(step), batch(step))


def test_prefetcher_never_runs_fn_concurrently_and_raises_errors():
  active, peak = [0], [0]
  lock = threading.Lock()

  def fn(step: int) -> int:
    with lock:
      active[0] += 1
      peak[0] = max(peak[0], active[0])
    try:
      time.sleep(0.01)
      if step == 2:
        raise ValueError('bad step 2')
      return step * step
    finally:
      with lock:
        active[0] -= 1

  pre = Prefetcher(fn, start=0)
  assert [pre.get(0), pre.get(1), pre.get(5), pre.get(0)] == [0, 1, 25, 0]
  pre.get(1)  # Prefetches step 2, which fails.
  with pytest.raises(ValueError, match='bad step 2'):
    pre.get(2)
  pre.close()
  assert peak[0] == 1
