"""Directories that are whole or absent (a token store, what is derived from it): each is
written into a fresh temporary directory beside its place and moved there under a lock
(paxlike.core.files.dir_written), so concurrent writers write it once and a killed writer
leaves only a `.tmp-` leftover, which the next writer removes."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from paxlike.core import files
from paxlike.data import prepare


def replace_atomically(final: Path, lock: Path, is_complete: Callable[[Path], bool],
                       write: Callable[[Path], None]) -> None:
  """Unless `is_complete(final)`, `write(tmp)` into a fresh temporary directory beside `final`
  and move that into place, holding `lock`; leftovers of killed writers are removed first."""
  with prepare._locked(lock):  # pylint: disable=protected-access (the data package's flock)
    if is_complete(final):
      return
    for stale in leftovers(final):
      shutil.rmtree(stale, ignore_errors=True)
    with files.dir_written(final) as tmp:
      write(tmp)
      if final.exists():  # Torn, or another key's (a hash prefix clash).
        shutil.rmtree(final)


def leftovers(final: Path) -> list[Path]:
  """Killed writers' temporaries of `final` (`files.dir_written`'s `.tmp-NAME-PID-HEX8`,
  `remove`'s `.tmp-NAME-removed-PID`), and no sibling's: a store named `NAME-x` has its own."""
  own = re.compile(rf'\.tmp-{re.escape(final.name)}-(?:\d+-[0-9a-f]{{8}}|removed-\d+)')
  return [p for p in final.parent.glob(f'.tmp-{final.name}-*') if own.fullmatch(p.name)]


def remove(final: Path, lock: Path) -> None:
  """Removes `final`, holding `lock`: moved aside first, so that a removal cut short leaves a
  `.tmp-` leftover, never a part of `final`."""
  with prepare._locked(lock):  # pylint: disable=protected-access
    if final.exists():
      aside = final.parent / f'.tmp-{final.name}-removed-{os.getpid()}'
      os.replace(final, aside)
      shutil.rmtree(aside, ignore_errors=True)
