"""paxlike.deploy.forked_child.fork: a child's garbage collector walks none of the objects it
inherited, and still collects the cycles it makes itself; the parent goes on collecting its own."""

from __future__ import annotations

import gc
import os
import warnings
import weakref

from paxlike.deploy import forked_child


class Node:
  """A weakly referenceable object that can sit in a reference cycle."""

  def __init__(self):
    self.other = self


def child_report() -> tuple[bool, bool]:
  """(whether the child's collector lists an object made before the fork, whether a cycle the
  child makes after it is collected), from a child forked by forked_child.fork."""
  inherited = Node()
  read, write = os.pipe()
  with warnings.catch_warnings():  # The worker has threads; the child only touches Python.
    warnings.simplefilter('ignore', DeprecationWarning)
    pid = forked_child.fork()
  if pid == 0:
    listed = any(o is inherited for o in gc.get_objects())
    made = Node()
    gone = weakref.ref(made)
    del made
    gc.collect()
    os.write(write, bytes([listed, gone() is None]))
    os._exit(0)
  os.close(write)
  report = os.read(read, 2)
  os.close(read)
  assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
  return bool(report[0]), bool(report[1])


def test_a_child_walks_nothing_it_inherited_and_collects_what_it_makes():
  listed, collected = child_report()
  assert not listed and collected


def test_the_parent_collects_the_cycles_it_makes_after_forking():
  child_report()
  made = Node()
  gone = weakref.ref(made)
  del made
  gc.collect()
  assert gone() is None
