"""Hugging Face checkpoint directories with random weights, for the tests that start a run from
one (`train.init_from=hf:DIR`): nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import flax.linen as nn
import jax
import numpy as np

from paxlike import interop


def random_params(model: nn.Module, seed: int = 0) -> dict:
  """`model`'s init from key(`seed`), unboxed, as numpy arrays."""
  # Jitted: eagerly, every op of the init compiles on its own.
  boxed = jax.jit(model.init)(jax.random.key(seed), np.zeros((1, 8), np.int32))['params']
  return jax.tree.map(np.asarray, nn.meta.unbox(boxed))


def write_random_checkpoint(model: nn.Module, directory: Path, seed: int = 0) -> None:
  """`model`'s init from key(`seed`), written as transformers lays it out (config.json and
  safetensors, `interop.save_hf_checkpoint`) to `directory`."""
  interop.save_hf_checkpoint(random_params(model, seed), model, directory)
