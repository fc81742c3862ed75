"""Every dense family, from a checkpoint directory in either config layout, loaded as a run
with `train.init_from='hf:DIR'` loads it: logits equal the float64 numpy reference
(tests/interop/reference.py) within 1e-4 of the logit scale in float32, at positions past the
sliding windows and RoPE thresholds, unrolled and scanned."""

import fiddle as fdl
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import NamedSharding, PartitionSpec as P

from paxlike.layers import TransformerLM
from paxlike.trainer import init_from
from tests.interop import checkpoints, reference

TOLERANCE = 1e-4


def relative_error(logits: np.ndarray, ref: np.ndarray) -> float:
  """Max |logits - ref| over max |ref|."""
  return float(np.max(np.abs(logits - ref)) / np.max(np.abs(ref)))


def paxlike_logits(directory, tokens, **fields) -> np.ndarray:
  """The logits of the model a run with train.init_from='hf:DIR' starts from: its fields from
  the source's config.json (init_from.model_overrides_from, which the CLI fills the model's
  unset fields with) and `fields`, its params streamed from the safetensors files onto the
  devices (init_from.load_params, what the trainer calls on a fresh start)."""
  source = f'hf:{directory}'
  model = fdl.build(fdl.Config(TransformerLM, **{**init_from.model_overrides_from(source),
                                                 **fields}))
  tokens = jnp.asarray(tokens)
  shapes = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), tokens))['params'])
  replicated = NamedSharding(jax.make_mesh((1,), ('data',)), P())
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                          shapes)
  params = traverse_util.unflatten_dict(init_from.load_params(source, abstract, model), sep='/')
  return np.asarray(jax.jit(model.apply)({'params': params}, tokens))


@pytest.mark.parametrize('layout', ['v4', 'v5'])
@pytest.mark.parametrize('case', sorted(checkpoints.CASES))
def test_logits_equal_the_reference(tmp_path, case, layout):
  cfg = checkpoints.CASES[case]
  cfg = checkpoints.v5(cfg) if layout == 'v5' else cfg
  tensors = checkpoints.random_tensors(cfg)
  directory = checkpoints.write(tmp_path, tensors, cfg)
  tokens = checkpoints.tokens(cfg)
  ref = reference.logits(tensors, cfg, tokens)
  error = relative_error(paxlike_logits(directory, tokens), ref)
  print(f'{case} {layout}: max relative logit error {error:.2e}')
  assert error < TOLERANCE
  if layout == 'v4':  # Scanned layers (a mixed local/global stack takes per-step flags).
    assert relative_error(paxlike_logits(directory, tokens, scan_layers=True), ref) < TOLERANCE


def test_the_reference_tells_the_features_apart():
  """Each feature the cases exercise changes the reference's logits (so the test can fail)."""
  tokens = checkpoints.tokens(checkpoints.CASES['llama2'])
  for case, change in [('llama3.1', {'rope_scaling': None}),
                       ('llama_dynamic', {'rope_scaling': None}),
                       ('llama_yarn', {'rope_scaling': None}),
                       ('mistral_window', {'sliding_window': None}),
                       ('gemma2', {'attn_logit_softcapping': None}),
                       ('gemma2', {'final_logit_softcapping': None}),
                       ('gemma3_text', {'rope_local_base_freq': 1_000_000.0}),
                       ('phi3', {'original_max_position_embeddings': 64})]:
    cfg = checkpoints.CASES[case]
    tensors = checkpoints.random_tensors(cfg)
    assert not np.allclose(reference.logits(tensors, cfg, tokens),
                           reference.logits(tensors, {**cfg, **change}, tokens), atol=1e-3), case
