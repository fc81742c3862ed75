"""Named numpy arrays in and out of Flower records, and the config both apps read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

if TYPE_CHECKING:  # The apps import paxlike.data (tfds) only where they use it.
  from paxlike.data.sources import DataSource


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


def client_sizes(data: DataSource) -> np.ndarray:
  """Each client's size, what cohorts are drawn by (`DataSource.client_sizes`, its data read
  first)."""
  data.prepare()
  return np.asarray(data.client_sizes)


def population(data: DataSource) -> int:
  """The experiment's client count: the clients its data holds."""
  return len(client_sizes(data))


def cohort(data: DataSource, seed: int, step: int, sizes: np.ndarray,
           live: list[int] | None = None) -> np.ndarray:
  """Round `step`'s client per cohort slot among the `live` clients (None: all), drawn by the
  source's own rule (`DataSource.cohort`) from `sizes`, the clients' sizes as this app knows
  them (a node's from its data, the server's from its nodes' reports): the simulation's
  cohort when every client is live."""
  return data.cohort(seed, step, live, sizes=sizes)
