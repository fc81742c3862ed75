"""python -m benchmarks.checkpoint_cost --pyspy_raw: a --saves_only run's py-spy stacks summed
into busy ms per save by thread, the main thread counted only inside the saves, idle waits not at
all."""

import pytest

from benchmarks import checkpoint_cost

RAW = '\n'.join([
    # Start-up imports on the main thread (before any save): not save time.
    'thread (11);<module> (checkpoint_cost.py:1);main (checkpoint_cost.py:2);_find_and_load (x:1) 50',
    # The main thread inside the saves.
    'thread (11): MainThread;<module> (checkpoint_cost.py:1);cpu_ms_per_save (checkpoint_cost.py:3);'
    'save (checkpoint.py:4) 4',
    # Orbax's stage threads, busy.
    'thread (12): array_type_handler;Thread.run (threading.py:1);write_fragment (serialization.py:9) 6',
    'thread (13): DeleterThread;Thread.run (threading.py:1);_rmtree_safe_fd (shutil.py:7) 10',
    'thread (14): array_type_handler;Thread.run (threading.py:1);open (backend.py:2) 2',
    # Parked threads: not busy.
    'thread (15): checkpoint_0;Thread.run (threading.py:1);_worker (concurrent/futures/thread.py:9) 99',
    'thread (16): asyncio_0;run (base_events.py:1);EpollSelector.select (selectors.py:4) 77',
])


def test_busy_time_per_save_by_thread_and_function():
  out = checkpoint_cost.busy_threads(RAW, rate=100, saves=2)
  per_sample = 1e3 / 100 / 2  # 5 ms of one save per sample
  assert out['busy_ms_per_save'] == pytest.approx((4 + 6 + 10 + 2) * per_sample)
  assert out['by_thread_ms'] == {'DeleterThread': 50.0, 'array_type_handler': 40.0,
                                 'MainThread': 20.0}
  assert out['by_function_ms']['_rmtree_safe_fd (shutil.py)'] == 50.0
  assert 'write_fragment (serialization.py)' in out['by_function_ms']
