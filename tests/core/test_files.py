"""paxlike.core.files: a path holds its old content or its new, never a part (a write killed
with SIGKILL, a write that raises), the temporary file never outlives a write that raised, the
file and its directory are fsynced, and permissions are `mode` less the umask."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paxlike.core import files

OLD = b'old content\n'


def fsynced_paths(monkeypatch) -> list[str]:
  """Records the path of every fd os.fsync is given (read through /proc/self/fd)."""
  seen: list[str] = []
  real = os.fsync

  def fsync(fd: int) -> None:
    seen.append(os.readlink(f'/proc/self/fd/{fd}'))
    real(fd)
  monkeypatch.setattr(os, 'fsync', fsync)
  return seen


def test_each_writer_writes_whole_and_leaves_no_temporary(tmp_path):
  files.write_bytes(tmp_path / 'a.bin', b'\x00\x01')
  files.write_text(tmp_path / 'b.txt', 'héllo')
  files.write_json(tmp_path / 'c.json', {'k': [1, 2]})
  files.write_json(tmp_path / 'd.json', {'k': 1}, indent=None, separators=(',', ':'))
  files.copy_file(tmp_path / 'a.bin', tmp_path / 'e.bin')
  assert (tmp_path / 'a.bin').read_bytes() == b'\x00\x01'
  assert (tmp_path / 'b.txt').read_text('utf-8') == 'héllo'
  assert (tmp_path / 'c.json').read_text() == '{\n  "k": [\n    1,\n    2\n  ]\n}\n'
  assert (tmp_path / 'd.json').read_text() == '{"k":1}\n'
  assert (tmp_path / 'e.bin').read_bytes() == b'\x00\x01'
  assert sorted(p.name for p in tmp_path.iterdir()) == ['a.bin', 'b.txt', 'c.json', 'd.json',
                                                        'e.bin']


def test_the_file_then_its_directory_are_fsynced(tmp_path, monkeypatch):
  seen = fsynced_paths(monkeypatch)
  files.write_text(tmp_path / 'x.txt', 'new')
  assert len(seen) == 2
  assert Path(seen[0]).parent == tmp_path and Path(seen[0]).name.startswith('.x.txt.')
  assert seen[1] == str(tmp_path)


def test_a_write_that_raises_keeps_the_old_file_and_removes_the_temporary(tmp_path):
  path = tmp_path / 'kept.txt'
  path.write_bytes(OLD)
  with pytest.raises(RuntimeError, match='disk on fire'):
    with files.open_atomic(path, binary=True) as file:
      file.write(b'half of the new')
      file.flush()
      assert len(list(tmp_path.iterdir())) == 2  # The temporary, beside the file.
      raise RuntimeError('disk on fire')
  assert path.read_bytes() == OLD
  assert [p.name for p in tmp_path.iterdir()] == ['kept.txt']


def test_a_failed_rename_removes_the_temporary(tmp_path):
  (tmp_path / 'taken').mkdir()
  (tmp_path / 'taken' / 'inside').write_text('x')
  with pytest.raises(OSError):
    files.write_text(tmp_path / 'taken', 'cannot replace a directory')
  assert [p.name for p in tmp_path.iterdir()] == ['taken']


def test_a_file_killed_mid_write_is_whole_or_absent(tmp_path):
  path = tmp_path / 'big.bin'
  path.write_bytes(OLD)
  child = subprocess.Popen([sys.executable, '-c', (
      'import sys, time; from paxlike.core import files\n'
      f'with files.open_atomic({str(path)!r}, binary=True) as f:\n'
      '  for _ in range(4096):\n'
      '    f.write(b"n" * 65536)\n'
      '    f.flush()\n'
      '    print("writing", flush=True)\n'
      '    time.sleep(0.01)\n')], stdout=subprocess.PIPE, cwd=Path(files.__file__).parents[2])
  assert child.stdout.readline() == b'writing\n'
  time.sleep(0.2)
  child.send_signal(signal.SIGKILL)
  child.wait()
  assert path.read_bytes() == OLD  # The old content, whole.
  leftovers = [p for p in tmp_path.iterdir() if p != path]
  assert len(leftovers) == 1 and leftovers[0].name.startswith('.big.bin.')
  assert leftovers[0].stat().st_size > 0  # Killed mid-write, its part never became `path`.
  files.write_bytes(path, b'new')  # The next write is not blocked by the leftover.
  assert path.read_bytes() == b'new'


def test_permissions_are_the_mode_less_the_umask(tmp_path):
  old = os.umask(0o022)
  try:
    files.write_text(tmp_path / 'plain', 'a')
    files.write_bytes(tmp_path / 'key', b'secret', mode=0o600)
    with files.dir_written(tmp_path / 'dir') as tmp:
      (tmp / 'f').write_text('x')
  finally:
    os.umask(old)
  assert (tmp_path / 'plain').stat().st_mode & 0o777 == 0o644
  assert (tmp_path / 'key').stat().st_mode & 0o777 == 0o600
  assert (tmp_path / 'dir').stat().st_mode & 0o777 == 0o755


def test_concurrent_writers_each_use_their_own_temporary(tmp_path):
  path = tmp_path / 'shared.json'
  with files.open_atomic(path) as first, files.open_atomic(path) as second:
    assert first.name != second.name
    first.write('1')
    second.write('2')
  assert json.loads(path.read_text()) in (1, 2)
  assert [p.name for p in tmp_path.iterdir()] == ['shared.json']


def test_a_directory_appears_whole_with_its_files_fsynced(tmp_path, monkeypatch):
  seen = fsynced_paths(monkeypatch)
  final = tmp_path / 'out' / 'store'
  with files.dir_written(final) as tmp:
    assert tmp.parent == final.parent and tmp.name.startswith('.tmp-store-')
    (tmp / 'sub').mkdir()
    (tmp / 'sub' / 'a').write_text('a')
    (tmp / 'b').write_text('b')
    assert not final.exists()
  assert (final / 'sub' / 'a').read_text() == 'a' and (final / 'b').read_text() == 'b'
  assert [p.name for p in final.parent.iterdir()] == ['store']
  names = [Path(p).name for p in seen]
  assert {'a', 'b', 'sub'} <= set(names) and seen[-1] == str(final.parent)


def test_a_directory_write_that_raises_leaves_nothing(tmp_path):
  with pytest.raises(ValueError):
    with files.dir_written(tmp_path / 'store') as tmp:
      (tmp / 'part').write_text('x')
      raise ValueError('bad input')
  assert not list(tmp_path.iterdir())


def test_a_directory_is_not_renamed_over_a_full_one(tmp_path):
  final = tmp_path / 'store'
  final.mkdir()
  (final / 'theirs').write_text('kept')
  with pytest.raises(OSError):
    with files.dir_written(final) as tmp:
      (tmp / 'mine').write_text('x')
  assert [p.name for p in tmp_path.iterdir()] == ['store']
  assert [p.name for p in final.iterdir()] == ['theirs']


def test_no_other_module_renames_files_into_place():
  """os.replace / os.rename / shutil.move appear only here, and in atomic_dirs.remove (a
  directory moved aside to be deleted): every other write goes through paxlike.core.files."""
  root = Path(files.__file__).parents[1]
  found = set()
  for path in root.rglob('*.py'):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and isinstance(node.func.value, ast.Name)
          and (node.func.value.id, node.func.attr) in {('os', 'replace'), ('os', 'rename'),
                                                       ('shutil', 'move')}):
        found.add(str(path.relative_to(root)))
  assert found == {'core/files.py', 'data/atomic_dirs.py'}


def test_a_stores_leftovers_are_its_own_temps_not_a_siblings(tmp_path):
  """A killed writer of `store` leaves `.tmp-store-PID-HEX8`; the stores `store-1` and
  `store-removed` beside it have temps that start the same way and must be left alone."""
  from paxlike.data import atomic_dirs
  final = tmp_path / 'store'
  with pytest.raises(RuntimeError):
    with files.dir_written(final):  # A writer that dies leaves nothing...
      raise RuntimeError
  killed = tmp_path / '.tmp-store-4242-0123abcd'  # ...one that is killed leaves its temp.
  aside = tmp_path / '.tmp-store-removed-4242'
  siblings = [tmp_path / '.tmp-store-1-4242-0123abcd', tmp_path / '.tmp-store-removed-1-99']
  for path in (killed, aside, *siblings):
    path.mkdir()
  assert sorted(atomic_dirs.leftovers(final)) == sorted([killed, aside])
  atomic_dirs.replace_atomically(final, tmp_path / 'lock', lambda p: p.exists(),
                                 lambda tmp: (tmp / 'x').write_text('x'))
  assert (final / 'x').read_text() == 'x' and not killed.exists() and not aside.exists()
  assert all(path.exists() for path in siblings)
