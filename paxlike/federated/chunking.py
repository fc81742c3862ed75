"""How many clients a round trains at a time when the config leaves `client_chunk` unset.

One client at a time (`lax.map`) on CPU, where vmapping the cohort runs the same ops on
cohort-times larger operands that fall out of cache; all at once on accelerators, where one
client's kernels are too small to fill the chip, and wherever the `clients` mesh axis really
shards the cohort (chunks would run one after another, each gathered); there, unless all at
once would not fit the device's memory (`clients_that_fit`, from the trainer). The figures:
docs/benchmarks.md (benchmarks/federated_round.py).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
from typing import Any, Iterator

import jax

from paxlike.federated.primitives import CLIENTS_AXIS

CPU_CLIENT_CHUNK = 1
_ALL_AT_ONCE = contextvars.ContextVar('paxlike_all_clients_at_once', default=False)
_THAT_FIT = contextvars.ContextVar('paxlike_clients_that_fit', default=None)


@contextlib.contextmanager
def all_clients_at_once() -> Iterator[None]:
  """Within: an unset `client_chunk` maps all clients at once on every platform (the exporter
  traces rounds so: a plan's client program is one client; chunking is the runtime's choice)."""
  token = _ALL_AT_ONCE.set(True)
  try:
    yield
  finally:
    _ALL_AT_ONCE.reset(token)


@contextlib.contextmanager
def clients_that_fit(chunk: int | None) -> Iterator[None]:
  """Within: an unset `client_chunk` that the platform would map all at once maps `chunk`
  clients at a time instead (None: as the platform would), what the trainer found fits memory."""
  token = _THAT_FIT.set(chunk)
  try:
    yield
  finally:
    _THAT_FIT.reset(token)


def clients_fitted() -> int | None:
  """The chunk `clients_that_fit` set around this call (None: none)."""
  return _THAT_FIT.get()


def configured_client_chunk(algorithm: Any) -> int | None:
  """The `client_chunk` an algorithm's config (a partial of its builder) sets; None: unset."""
  return getattr(algorithm, 'keywords', {}).get('client_chunk')


def default_client_chunk(platform: str, clients_axis_size: int) -> int | None:
  """Clients per chunk for a round on `platform` ('cpu', 'gpu', 'tpu') whose mesh splits the
  cohort over `clients_axis_size` devices; None means all clients at once (vmapped)."""
  if platform == 'cpu' and clients_axis_size == 1:
    return CPU_CLIENT_CHUNK
  return None


def resolve_client_chunk(client_chunk: int | None) -> int | None:
  """`client_chunk` if the config set it, else the default for the ambient mesh's platform,
  where that is all at once the chunk `clients_that_fit` says fits memory (said once on
  stderr). Call while tracing the round."""
  if client_chunk is not None or _ALL_AT_ONCE.get():
    return client_chunk
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else mesh.abstract_device
  platform = jax.default_backend() if device is None else device.platform
  clients = 1 if mesh.empty else dict(mesh.shape).get(CLIENTS_AXIS, 1)
  chosen = default_client_chunk(platform, clients)
  if chosen is None:
    chosen = _THAT_FIT.get()
  _say_once(f'federated rounds: client_chunk unset, using {chosen} on {platform} '
            f'({"all clients at once" if chosen is None else "clients per chunk"})')
  return chosen


@functools.cache
def _say_once(message: str) -> None:
  print(message, file=sys.stderr, flush=True)
