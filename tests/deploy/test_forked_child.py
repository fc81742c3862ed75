"""paxlike.deploy.forked_child.fork: a child's garbage collector walks none of the objects it
inherited, and still collects the cycles it makes itself; the parent goes on collecting its own.
Each test unfreezes the worker's objects afterwards, so the rest of the suite collects them."""

from __future__ import annotations

import gc
import os
import warnings
import weakref

from paxlike.deploy import forked_child


class Node:
  """A weakly referenceable object in a reference cycle with itself."""

  def __init__(self):
    self.itself = self


def a_cycle_is_collected() -> bool:
  """Whether a new, unreachable cycle is freed by a collection."""
  node = Node()
  gone = weakref.ref(node)
  del node
  gc.collect()
  return gone() is None


def fork() -> int:
  """forked_child.fork in this worker, which has threads (the child only touches Python)."""
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', DeprecationWarning)
    return forked_child.fork()


def test_a_child_walks_nothing_it_inherited_and_collects_what_it_makes():
  inherited = Node()
  read, write = os.pipe()
  try:
    pid = fork()
    if pid == 0:  # Never back into pytest: whatever happens, the child exits here.
      try:
        listed = any(o is inherited for o in gc.get_objects())
        os.write(write, bytes([listed, a_cycle_is_collected()]))
      finally:
        os._exit(0)
    os.close(write)
    report = os.read(read, 2)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
  finally:
    gc.unfreeze()
    os.close(read)
  assert report == bytes([False, True])  # Not listed; its own cycle collected.


def test_the_parent_collects_the_cycles_it_makes_after_forking():
  try:
    pid = fork()
    if pid == 0:
      os._exit(0)
    os.waitpid(pid, 0)
    assert a_cycle_is_collected()
  finally:
    gc.unfreeze()
