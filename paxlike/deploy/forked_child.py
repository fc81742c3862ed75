"""How a child that stands in for a fresh process is forked, takes its environment and ends (the
warm ClientApp server's children; the test suite's forked CLI runs)."""

from __future__ import annotations

import gc
import os
import sys
import traceback
from typing import Callable, NoReturn

from paxlike.core import cpu_pool


def fork() -> int:
  """os.fork(), after collecting this process's garbage and moving every object it still has
  into the collector's permanent generation (gc.collect, gc.freeze): a child's collections
  then never walk what it inherited, so they neither spend its CPU on those objects nor copy,
  by touching them, the pages it shares with the parent. The parent goes on collecting what it
  makes after the fork. The collect first keeps a long-lived server from freezing garbage;
  what it holds at a fork and later drops in a reference cycle stays (reference counting still
  frees the rest), which a server that keeps little between requests can afford."""
  gc.collect()
  gc.freeze()
  return os.fork()


def take_environment(env: dict[str, str]) -> None:
  """Makes `env` the child's whole environment, then does what `import paxlike` does with the
  environment in a fresh process (the parent imported it in its own): sizes XLA:CPU's pool for
  the child's forced devices (core/cpu_pool.py). Before the child starts a jax backend."""
  os.environ.clear()
  os.environ.update(env)
  cpu_pool.size_pool_for_forced_devices()


def exit_as_main(main: Callable[[], object]) -> NoReturn:
  """Runs `main` as the child's whole program, then exits the process with the code Python would
  give it: 0 when it returns, a SystemExit's code (a text one printed on stderr, code 1), 1 with
  the traceback on any other error. Output is flushed first and nothing else runs on the way out
  (os._exit: no atexit handler the parent registered)."""
  code = 1
  try:
    main()
    code = 0
  except SystemExit as exit_:
    code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    if isinstance(exit_.code, str):
      print(exit_.code, file=sys.stderr)
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
  finally:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
