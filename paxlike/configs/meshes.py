"""Mesh presets. `-1` takes all the devices left over, so presets fit any device count."""

import fiddle as fdl

from paxlike.core.partitioning import MeshConfig


def data_parallel() -> fdl.Config[MeshConfig]:
  """Every device on the 'data' axis."""
  return fdl.Config(MeshConfig, ici=(-1,), axes=('data',))


def data_model(model: int = 2) -> fdl.Config[MeshConfig]:
  """Data parallel × tensor parallel of size `model`."""
  return fdl.Config(MeshConfig, ici=(-1, model), axes=('data', 'model'))


def fsdp() -> fdl.Config[MeshConfig]:
  """Every device on 'fsdp': params, gradients and optimizer state sharded on 'embed' (ZeRO-3)."""
  return fdl.Config(MeshConfig, ici=(-1,), axes=('fsdp',))


def fsdp_model(model: int = 4) -> fdl.Config[MeshConfig]:
  """FSDP × tensor parallel of size `model` (keep 'model' inside a host: it talks every layer)."""
  return fdl.Config(MeshConfig, ici=(-1, model), axes=('fsdp', 'model'))


def stage_data(stages: int = 4) -> fdl.Config[MeshConfig]:
  """GPipe over `stages` pipeline stages x data parallel (docs/pipeline.md: 'stage' outermost,
  on the slowest links)."""
  return fdl.Config(MeshConfig, ici=(stages, -1), axes=('stage', 'data'))


def pod_pipeline(stages: int = 4, model: int = 4) -> fdl.Config[MeshConfig]:
  """A multi-host pod: `stages` pipeline stages across hosts (over DCN, the slow links), and
  inside each host FSDP × tensor parallel of size `model` (docs/pipeline.md, "Choosing the
  mesh"). Needs a multiple of `stages` × `model` devices."""
  return fdl.Config(MeshConfig, ici=(1, -1, model), dcn=(stages, 1, 1),
                    axes=('stage', 'fsdp', 'model'))
