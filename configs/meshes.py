"""Mesh presets. `-1` takes all the devices left over, so presets fit any device count."""

import fiddle as fdl

from paxlike.partitioning import MeshConfig


def data_parallel() -> fdl.Config[MeshConfig]:
  """Every device on the 'data' axis."""
  return fdl.Config(MeshConfig, ici=(-1,), axes=('data',))


def data_model(model: int = 2) -> fdl.Config[MeshConfig]:
  """Data parallel × tensor parallel of size `model`."""
  return fdl.Config(MeshConfig, ici=(-1, model), axes=('data', 'model'))


def clients_data(clients: int = 2) -> fdl.Config[MeshConfig]:
  """Federated: clients spread over `clients` device groups, each data-parallel."""
  return fdl.Config(MeshConfig, ici=(clients, -1), axes=('clients', 'data'))
