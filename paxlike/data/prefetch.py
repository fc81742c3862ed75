"""One-thread, one-step-ahead prefetching of a pure function of the step."""

from collections.abc import Callable
import concurrent.futures
from typing import Generic, TypeVar

T = TypeVar('T')


class Prefetcher(Generic[T]):
  """`get(step)` returns fn(step) and starts fn(step + 1) in a background thread.

  `fn` must be a pure function of the step, so results equal direct calls. `fn` never runs
  twice at once: a `get` for a step other than the prefetched one waits for the prefetch,
  drops it and computes directly. Exceptions raised by `fn` surface in `get`.
  """

  def __init__(self, fn: Callable[[int], T], start: int):
    self._fn = fn
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='prefetch')
    self._step = start
    self._future: concurrent.futures.Future[T] | None = self._pool.submit(fn, start)

  def get(self, step: int) -> T:
    """fn(step), computed ahead when `step` is the one after the previous `get`."""
    future, self._future = self._future, None
    if future is not None and self._step == step:
      result = future.result()
    else:
      if future is not None:
        concurrent.futures.wait([future])
      result = self._fn(step)
    self._step, self._future = step + 1, self._pool.submit(self._fn, step + 1)
    return result

  def close(self) -> None:
    """Drops the pending prefetch and stops the thread."""
    if self._future is not None:
      self._future.cancel()
      self._future = None
    self._pool.shutdown(wait=True)

  def __enter__(self) -> 'Prefetcher[T]':
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
