"""State the plan carries at the clients (DiLoCo's inner optimizer state, SCAFFOLD's controls),
kept by the nodes, never by the server (issue 72).

The plan stacks it by cohort slot (`rounds.client_state`): slot s's row is the state of the
replica (DiLoCo) or client (SCAFFOLD) that trains in slot s. The server keeps only each slot's
*version*, the round that last updated its row (the export's start step: the export's own row,
which every node reads from its copy of the export), and sends it with the slot. The node that
runs the slot reads that version of the row from its store, runs the client program, writes
the new row as the round's version and replies with the contributions only.

A node's store is one file, `client_state.npz` in its `state-dir` (node config), each slot's
last `KEEP` versions (a restarted ServerApp resumes from a checkpoint whose versions may be a
round behind the newest), written atomically (paxlike.core.files: a temporary file, fsync,
rename, fsync of the directory) before the reply, and read again by each message's process, so
a restarted node (or ClientApp process) continues from it.

When a slot moves to another node (a sampled cohort: replica s trains on another node's
client), the node holding its version seals the row for the new node (X25519 with a fresh key
of its own, HKDF-SHA256, AES-GCM bound to the slot and version; `query.handoff`), and the server
relays the sealed bytes in the train message without being able to read them. A server that
lies about a node's public key could read them: as for SecAgg+, the server is trusted to
follow the protocol, not to see the values.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np

from paxlike.core import files as file_io

STORE, KEY = 'client_state.npz', 'state_x25519.key'
KEEP = 3  # Versions kept per slot.


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
  buffer = io.BytesIO()
  np.savez(buffer, **arrays)
  return buffer.getvalue()


def _npz_arrays(data: bytes) -> dict[str, np.ndarray]:
  with np.load(io.BytesIO(data)) as loaded:
    return dict(loaded)


class Store:
  """A node's client state: {slot: {version: {name: row}}}, persisted in `directory`."""

  def __init__(self, directory: str | Path):
    self.path = Path(directory) / STORE
    self.rows: dict[int, dict[int, dict[str, np.ndarray]]] = {}
    if self.path.exists():
      for key, value in _npz_arrays(self.path.read_bytes()).items():
        where, name = key.split('/', 1)
        slot, version = map(int, where.split('@'))
        self.rows.setdefault(slot, {}).setdefault(version, {})[name] = value

  def row(self, slot: int, version: int) -> dict[str, np.ndarray] | None:
    return self.rows.get(slot, {}).get(version)

  def put(self, slot: int, version: int, row: dict[str, np.ndarray]) -> None:
    """Keeps `row` as slot `slot`'s state after round `version` (its oldest versions beyond
    KEEP dropped); `save` writes it."""
    versions = self.rows.setdefault(slot, {})
    versions[version] = {n: np.asarray(v) for n, v in row.items()}
    for old in sorted(versions)[:-KEEP]:
      del versions[old]

  def held(self) -> list[tuple[int, int]]:
    return sorted((s, v) for s, versions in self.rows.items() for v in versions)

  def save(self) -> None:
    self.path.parent.mkdir(parents=True, exist_ok=True)
    file_io.write_bytes(self.path, _npz_bytes({
        f'{s}@{v}/{n}': a for s, versions in self.rows.items()
        for v, row in versions.items() for n, a in row.items()}), mode=0o644)


def node_key(directory: str | Path) -> Any:
  """The node's X25519 key for handoffs, made (0600) the first time."""
  from cryptography.hazmat.primitives import serialization
  from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
  path = Path(directory) / KEY
  if not path.exists():
    path.parent.mkdir(parents=True, exist_ok=True)
    file_io.write_bytes(path, X25519PrivateKey.generate().private_bytes_raw(), mode=0o600)
  return X25519PrivateKey.from_private_bytes(path.read_bytes())


def public_hex(key: Any) -> str:
  return key.public_key().public_bytes_raw().hex()


def _cipher(private: Any, public: Any) -> Any:
  from cryptography.hazmat.primitives import hashes
  from cryptography.hazmat.primitives.ciphers.aead import AESGCM
  from cryptography.hazmat.primitives.kdf.hkdf import HKDF
  secret = private.exchange(public)
  return AESGCM(HKDF(hashes.SHA256(), 32, None, b'paxlike client state').derive(secret))


def seal(row: dict[str, np.ndarray], recipient_hex: str, slot: int, version: int) -> np.ndarray:
  """`row` encrypted for the node whose public key is `recipient_hex`, as uint8 bytes."""
  from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
  mine = X25519PrivateKey.generate()
  nonce = os.urandom(12)
  sealed = _cipher(mine, X25519PublicKey.from_public_bytes(bytes.fromhex(recipient_hex))).encrypt(
      nonce, _npz_bytes(row), f'{slot}@{version}'.encode())
  return np.frombuffer(public_hex(mine).encode() + nonce + sealed, np.uint8)


def unseal(key: Any, blob: np.ndarray, slot: int, version: int) -> dict[str, np.ndarray]:
  """The row `seal` sealed for `key`'s node (cryptography's InvalidTag if it was not)."""
  from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
  data = np.asarray(blob, np.uint8).tobytes()
  sender = X25519PublicKey.from_public_bytes(bytes.fromhex(data[:64].decode()))
  return _npz_arrays(_cipher(key, sender).decrypt(data[64:76], data[76:],
                                                  f'{slot}@{version}'.encode()))


def initial_row(export_dir: str | Path, names: list[str], slot: int) -> dict[str, np.ndarray]:
  """Slot `slot`'s row in the export's own state (the version of the export's start step)."""
  from paxlike.export import run as executor
  carried = executor._restore(Path(export_dir) / 'state')
  return {name: carried[name][slot] for name in names}
