"""LM sizes with their recommended meshes: `SIZES[name]` → model config, mesh config, seq len.

Training state is about 16 bytes per parameter (float32 params, gradients and two Adam moments),
which decides the mesh: replicate while it fits, shard it with FSDP when it doesn't, and add
tensor parallelism ('model') when the per-device batch FSDP needs becomes too small.

    size   params         state    mesh (axes: ici)
    tiny   459,392        7 MB     data: -1
    125m   134,105,856    2.1 GB   data: -1
    350m   373,867,520    6 GB     fsdp: -1
    1b     1,100,048,384  18 GB    fsdp: -1
    8b     8,030,261,248  128 GB   fsdp: -1 × model: 4
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import fiddle as fdl

from configs import meshes, models
from paxlike.layers import TransformerLM
from paxlike.trainer.partitioning import MeshConfig


@dataclasses.dataclass(frozen=True)
class Size:
  """A model size: its config, its recommended mesh, the sequence length it is meant for."""

  model: Callable[[], fdl.Config[TransformerLM]]
  mesh: Callable[[], fdl.Config[MeshConfig]]
  seq_len: int


SIZES: dict[str, Size] = {
    'tiny': Size(models.lm_tiny_llama, meshes.data_parallel, 256),
    '125m': Size(models.lm_125m, meshes.data_parallel, 2048),
    '350m': Size(models.lm_350m, meshes.fsdp, 2048),
    '1b': Size(models.lm_1b, meshes.fsdp, 2048),
    '8b': Size(models.lm_8b, meshes.fsdp_model, 8192),
}


def use_size(cfg: fdl.Config, name: str) -> None:
  """Fiddler body: set a task config's model and mesh to size `name` (a key of SIZES)."""
  if name not in SIZES:
    raise ValueError(f'unknown size {name!r}; one of {sorted(SIZES)}')
  cfg.model = SIZES[name].model()
  cfg.mesh = SIZES[name].mesh()
