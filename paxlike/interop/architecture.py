"""What one Hugging Face `model_type` is to paxlike: an `Architecture` record (in the spirit of
optax's two-function NamedTuple; not `paxlike.families.Family`, which is a kind of paxlike model),
and the tensor-map entries every architecture's names are built from.

A family maps a config.json dict to `TransformerLM` fields and back, names each checkpoint
tensor with the paxlike param(s) it holds, and says why a model cannot be written as it. The
shared loading and export paths (`paxlike.interop.checkpoint`) use nothing else.
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Mapping, NamedTuple

import jax.numpy as jnp
import numpy as np

from paxlike.layers import TransformerLM

Path = tuple[str, ...]  # A param's path in the unrolled ('block_{i}') tree.


class Tensor(NamedTuple):
  """One checkpoint tensor: the paxlike params it holds (one path, or several for a fused
  tensor such as Phi-3's qkv_proj), `to_pax(hf) -> one value per path` and
  `to_hf(*values) -> hf`. With `row` set, the tensor is row `row` (axis 0) of its one param,
  which stacks several tensors (e.g. one per expert)."""

  paths: tuple[Path, ...]
  to_pax: Callable[[np.ndarray], tuple[np.ndarray, ...]]
  to_hf: Callable[..., np.ndarray]
  row: int | None = None


NameMap = dict[str, Tensor]  # HF tensor name -> Tensor.


def single(path: Path, to_pax: Callable[[np.ndarray], np.ndarray] = lambda w: w,
           to_hf: Callable[[np.ndarray], np.ndarray] = lambda p: p) -> Tensor:
  """A tensor that holds one param (`to_pax`/`to_hf` convert one array each way)."""
  return Tensor((path,), lambda w: (to_pax(w),), to_hf)


def transposed(path: Path) -> Tensor:
  """An HF [out, in] linear weight held as a paxlike [in, out] kernel."""
  return single(path, lambda w: w.T, lambda p: p.T)


def expert_row(path: Path, row: int, to_pax: Callable[[np.ndarray], np.ndarray] = lambda w: w,
               to_hf: Callable[[np.ndarray], np.ndarray] = lambda p: p) -> Tensor:
  """A tensor that is row `row` of the stacked param at `path` (e.g. expert `row`'s kernel)."""
  return Tensor((path,), lambda w: (to_pax(w),), to_hf, row)


def fused(paths: tuple[Path, ...], sizes: tuple[int, ...],
          parts: tuple[Tensor, ...]) -> Tensor:
  """An HF tensor made of `parts` stacked along axis 0 (rows `sizes` each), e.g. Phi-3's
  qkv_proj = [q_proj; k_proj; v_proj]: split on import, concatenated on export."""
  bounds = np.cumsum(sizes)[:-1]

  def to_pax(w: np.ndarray) -> tuple[np.ndarray, ...]:
    return tuple(part.to_pax(piece)[0] for part, piece in zip(parts, np.split(w, bounds)))

  def to_hf(*values: np.ndarray) -> np.ndarray:
    pieces = [part.to_hf(v) for part, v in zip(parts, values)]
    # jnp for shapes traced by jax.eval_shape (the checks), numpy for real exports.
    xp = np if all(isinstance(p, np.ndarray) for p in pieces) else jnp
    return xp.concatenate(pieces, axis=0)

  return Tensor(paths, to_pax, to_hf)


class Architecture(NamedTuple):
  """One Hugging Face architecture (`hf_class`, e.g. LlamaForCausalLM, is config.json's
  `architectures` entry).

  `model_fields(hf)`: TransformerLM fields from a config.json dict (UserError naming any field
  whose value it cannot honour); `hf_config(model)`: the config.json to export; `tensor_names
  (model)`: the checkpoint's tensors; `mismatches(model)`: why `model` cannot be exported as
  this family (empty: it can); `import_names(model, have)`, when given: the tensors of a
  checkpoint holding tensors named `have`, for a family whose checkpoints come in more than one
  layout (e.g. experts per expert or fused; `tensor_names` is the one export writes)."""

  model_type: str
  hf_class: str
  model_fields: Callable[[Mapping[str, Any]], dict[str, Any]]
  hf_config: Callable[[TransformerLM], dict[str, Any]]
  tensor_names: Callable[[TransformerLM], NameMap]
  mismatches: Callable[[TransformerLM], list[str]]
  import_names: Callable[[TransformerLM, Collection[str]], NameMap] | None = None
