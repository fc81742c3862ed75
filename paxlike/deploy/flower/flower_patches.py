"""Every change paxlike makes to Flower's own code, in one place: shorter waits where a message
would otherwise sit idle (docs/flower.md, "Polling"). Flower exposes none of these waits as a
setting (its CLIs, its environment variables and its Grid take none), so each patch replaces a
module attribute that Flower's code looks up when it runs:

- `supernode`: the SuperNode's loop (`flwr.supernode.start_client_internal`) sleeps at most
  SUPERNODE_POLL seconds at a time (its `time.sleep(3)` after a pull that found no message, its
  `time.sleep(0.5)` while it waits for a reply) and pulls a message's arrays `polling.sooner`;
- `server_app`: the ServerApp's HTTP Grid (`flwr.superlink.grid.http_grid`) pulls a reply's
  arrays `polling.sooner`;
- `client_app`: a ClientApp process (`flwr.supernode.runtime.run_clientapp`) pulls its
  message's arrays `polling.sooner`.

They were written for flwr FLOWER_VERSION. On another version, or when what a patch replaces is
not as expected (`problems`), `apply` patches nothing and warns in one line: Flower then keeps
its own waits, which makes a run slower, not different. tests/deploy/test_flower_patches.py
fails when Flower changes any of it.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import time
import types
from typing import Any

FLOWER_VERSION = '1.42.0'
SUPERNODE_POLL = 0.3  # Seconds; each wake is an HTTPS pull the SuperLink answers.
# The keywords `polling.sooner` sets on Flower's pull functions.
BACKOFF_KEYWORDS = ('initial_backoff', 'backoff_cap')
SUPERNODE_LOOP = 'flwr.supernode.start_client_internal'
# (patch, module, attribute, the inflatable_utils function it must be, or None for `time`).
TARGETS = (
    ('supernode', SUPERNODE_LOOP, 'time', None),
    ('supernode', SUPERNODE_LOOP, 'pull_objects', 'pull_objects'),
    ('server_app', 'flwr.superlink.grid.http_grid', 'pull_objects', 'pull_objects'),
    ('client_app', 'flwr.supernode.runtime.run_clientapp', 'pull_and_inflate_object_from_tree',
     'pull_and_inflate_object_from_tree'),
)
_applied: set[str] = set()


class CappedSleeps(types.ModuleType):
  """The `time` module as the SuperNode's loop sees it: `sleep` waits at most SUPERNODE_POLL
  seconds."""

  def __init__(self) -> None:
    super().__init__('time')

  def __getattr__(self, name: str) -> Any:
    return getattr(time, name)

  @staticmethod
  def sleep(seconds: float) -> None:
    time.sleep(min(seconds, SUPERNODE_POLL))


def installed_version() -> str:
  import flwr
  return str(getattr(flwr, '__version__', 'unknown'))


def problems(patches: tuple[str, ...] = ('supernode', 'server_app', 'client_app')) -> list[str]:
  """What in the installed Flower is not what `patches` were written for (its version, a module
  or attribute gone, a pull function without the backoff keywords); [] when they apply."""
  found = []
  if (version := installed_version()) != FLOWER_VERSION:
    found.append(f'flwr {version} is installed, the patches are for {FLOWER_VERSION}')
  utils = importlib.import_module('flwr.supercore.inflatable.inflatable_utils')
  for patch, module_name, attribute, function in TARGETS:
    if patch not in patches:
      continue
    where = f'{module_name}.{attribute}'
    try:
      module = importlib.import_module(module_name)
    except ImportError as error:
      found.append(f'{module_name} does not import ({error})')
      continue
    value = getattr(module, attribute, None)
    if function is None:
      if value is not time and not isinstance(value, CappedSleeps):
        found.append(f'{where} is not the time module')
      continue
    original = getattr(value, 'func', value)  # Already patched: a partial of the original.
    if original is not getattr(utils, function, None):
      found.append(f'{where} is not inflatable_utils.{function}')
    elif not set(BACKOFF_KEYWORDS) <= set(inspect.signature(original).parameters):
      found.append(f'{where} takes no {" or ".join(BACKOFF_KEYWORDS)}')
  return found


def apply(*patches: str) -> bool:
  """Applies `patches` (of 'supernode', 'server_app', 'client_app') in this process, each once;
  False, with one warning line on stderr and nothing patched, when `problems` finds any."""
  if not (patches := tuple(p for p in patches if p not in _applied)):
    return True
  if found := problems(patches):
    print(f'paxlike: Flower keeps its own waits ({"; ".join(found)})', file=sys.stderr,
          flush=True)
    return False
  from paxlike.deploy.flower import polling
  for patch, module_name, attribute, function in TARGETS:
    if patch in patches:
      module = importlib.import_module(module_name)
      setattr(module, attribute, CappedSleeps() if function is None
              else polling.sooner(getattr(module, attribute)))
  _applied.update(patches)
  return True
