"""Named numpy arrays in and out of Flower records, and the config both apps read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np


def to_record(arrays: Mapping[str, np.ndarray]) -> Any:
  """An ArrayRecord of `arrays` (Flower refuses jax arrays: numpy first)."""
  from flwr.app import Array, ArrayRecord
  record = ArrayRecord()
  for name, value in arrays.items():
    record[name] = Array(np.ascontiguousarray(np.asarray(value)))
  return record


def from_record(record: Any) -> dict[str, np.ndarray]:
  """The named numpy arrays of an ArrayRecord."""
  return {name: array.numpy() for name, array in record.items()}


def payload_bytes(record: Any) -> int:
  """The bytes of an ArrayRecord's serialized arrays (what a message carries, less framing)."""
  return sum(len(array.data) for array in record.values())


SHARED, ONCE = 'all', 'once'  # Record key prefixes: a message's broadcasts, its once values.


def slot_key(slot: int | str, name: str) -> str:
  """The record key of cohort slot `slot`'s value `name` (or SHARED's or ONCE's)."""
  return f'{slot}/{name}'


def with_prefix(values: dict[str, np.ndarray], prefix: int | str) -> dict[str, np.ndarray]:
  """The values whose key is `slot_key(prefix, name)`, by name."""
  start = slot_key(prefix, '')
  return {k[len(start):]: v for k, v in values.items() if k.startswith(start)}


def read_plan(export_dir: str | Path) -> dict[str, Any]:
  return json.loads((Path(export_dir) / 'plan.json').read_text())


def load_task(config_file: str | Path) -> Any:
  """The experiment's built task from a saved config (paxlike.config.config_io JSON)."""
  from paxlike.config import config_io
  return config_io.build(config_io.load_file(config_file))


def int_list(text: str) -> list[int]:
  """'0,3,5' -> [0, 3, 5] ('' -> [])."""
  return [int(part) for part in str(text).split(',') if part.strip()]


def client_sizes(data: Any) -> np.ndarray:
  """Each client's FedAvg size, what cohorts are sampled from (its data read first): an image
  source's examples per client, a text source's training tokens per client."""
  data.prepare()
  sizes = getattr(data, 'client_sizes', None)
  return np.asarray(data.packed.client_tokens if sizes is None else sizes)


def num_clients(data: Any) -> int:
  """The experiment's client count: the source's setting where it has one (images), else the
  clients its data holds (text: one per file or client field value)."""
  count = getattr(data, 'num_clients', None)
  return int(count) if count is not None else len(client_sizes(data))


def cohort(data: Any, seed: int, step: int, sizes: np.ndarray,
           live: list[int] | None = None) -> np.ndarray:
  """Round `step`'s client per cohort slot among the `live` clients (None: all), as the
  source's `round_batches` draws it when all are live: text pooled into one client gives every
  slot client 0 (TextData's rule: each slot then reads its own rows of the pool; PADDED when
  client 0 is lost), any other source samples among the clients' `sizes`
  (`sources.sample_cohort`, which gives the simulation's cohort when every client is live)."""
  from paxlike.data import sources
  if getattr(data, 'partition', None) == 'pooled':
    held = live is None or 0 in live
    return np.full(data.clients_per_round, 0 if held else sources.PADDED, np.int64)
  return sources.sample_cohort(seed, step, sizes, data.clients_per_round, data.sampling, live)
