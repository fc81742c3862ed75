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
    moe_1b 1,100,628,992  18 GB    data: -1  (444,956,672 active per token)
    8b_pipeline (the 8b)  128 GB   stage: 4 (dcn) × fsdp: -1 × model: 4, 16 microbatches

`moe_1b` is a mixture of experts for one GPU: the 350m shape with every other MLP 8 experts,
top-2; its FLOPs (and MFU) count the active params, its memory every expert. On more devices
split the experts over an 'expert' axis (docs/models.md, "Mixture of experts").

`8b_pipeline` is the 8b for a multi-host pod: 4 GPipe stages across hosts, FSDP × tensor
parallel inside each. Each device holds a quarter of the layers, but every stage still computes
the embeddings and the head on its whole batch, whose float32 logits dominate its memory (the
estimates per device: docs/models.md; docs/pipeline.md, "Not done"). Use it where FSDP would
cross slow links, not to save memory.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import fiddle as fdl

from paxlike.configs import meshes, models
from paxlike.layers import TransformerLM
from paxlike.core.partitioning import MeshConfig


@dataclasses.dataclass(frozen=True)
class Size:
  """A model size: its config, its recommended mesh, the sequence length it is meant for."""

  model: Callable[[], fdl.Config[TransformerLM]]
  mesh: Callable[[], fdl.Config[MeshConfig]]
  seq_len: int
  microbatches: int = 1  # GPipe microbatches per step, for a mesh with a 'stage' axis.


def lm_moe_1b() -> fdl.Config[TransformerLM]:
  """1,100,628,992 parameters, 444,956,672 active per token: the 350m shape (24 × 1024, bf16,
  scan, 'dots' remat) with every other MLP a mixture of 8 SwiGLU experts of width 2816, each
  token routed to 2 (capacity factor 1.25)."""
  cfg = models.lm_350m()
  cfg.num_experts, cfg.experts_per_token, cfg.moe_every, cfg.capacity_factor = 8, 2, 2, 1.25
  return cfg


SIZES: dict[str, Size] = {
    'tiny': Size(models.lm_tiny_llama, meshes.data_parallel, 256),
    '125m': Size(models.lm_125m, meshes.data_parallel, 2048),
    '350m': Size(models.lm_350m, meshes.fsdp, 2048),
    '1b': Size(models.lm_1b, meshes.fsdp, 2048),
    '8b': Size(models.lm_8b, meshes.fsdp_model, 8192),
}
# Mixtures of experts: their params are not the dense Llama count of SIZES.
MOE_SIZES: dict[str, Size] = {
    'moe_1b': Size(lm_moe_1b, meshes.data_parallel, 2048),
}
# Dense sizes on a pipelined multi-host mesh: 16 microbatches keep 4 stages' bubble at 16%.
PIPELINE_SIZES: dict[str, Size] = {
    '8b_pipeline': Size(models.lm_8b, meshes.pod_pipeline, 8192, microbatches=16),
}


def use_size(cfg: fdl.Config, name: str) -> None:
  """Fiddler body: set a task config's model and mesh to size `name` (a key of SIZES,
  MOE_SIZES or PIPELINE_SIZES), and a pipelined size's `train.microbatches`."""
  every = {**SIZES, **MOE_SIZES, **PIPELINE_SIZES}
  if name not in every:
    raise ValueError(f'unknown size {name!r}; one of {sorted(every)}')
  size = every[name]
  cfg.model = size.model()
  cfg.mesh = size.mesh()
  if size.microbatches > 1:
    cfg.train.microbatches = size.microbatches


@dataclasses.dataclass(frozen=True)
class ChipFit:
  """What a dense size needs to train on one 16 GB chip (a TPU v5e: 15.75 GiB of HBM), as
  measured there at seq 2048 (docs/benchmarks.md): sequences per chip, the remat policy, and
  whether the params (and so AdamW's moments) are kept in bfloat16 with no float32 copy."""

  batch: int
  remat_policy: str
  bf16_params: bool = False


# Each the fastest fit measured on a v5e (docs/benchmarks.md, "Accelerator checks": the MFU of
# each and of what else was tried). The 1B's float32 params and Adam moments alone overfill it;
# the 350M's fit at batch 4 (54.3% MFU through the trainer, 57.5% at this one).
CHIP_16GB: dict[str, ChipFit] = {
    '125m': ChipFit(8, 'none'),
    '350m': ChipFit(6, 'dots_attention', bf16_params=True),
    '1b': ChipFit(2, 'dots_attention', bf16_params=True),
}


def size_of(model: fdl.Config) -> str | None:
  """The name in SIZES of a model config's shape (layers, width, heads), or None."""
  shape = lambda cfg: (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.d_ff)
  return next((name for name, size in SIZES.items() if shape(size.model()) == shape(model)),
              None)
