"""Model sizes: abstract builds with the hand-counted parameters, FLOPs, and meshes that fit."""

import math

import fiddle as fdl
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from fiddle.experimental import serialization

from configs import models
from configs.sizes import SIZES, use_size
from paxlike import model_stats, partitioning
from paxlike.layers import CnnClassifier

# Published counts: TinyLlama-1.1B has 1,100,048,384 parameters, Llama-3-8B 8,030,261,248.
EXPECTED = {'tiny': 459_392, '125m': 134_105_856, '350m': 373_867_520, '1b': 1_100_048_384,
            '8b': 8_030_261_248}


def hand_count(vocab_size, num_layers, d_model, num_heads, num_kv_heads, d_ff, tied_embeddings,
               **_) -> int:
  """Llama-shaped count: embeddings (+ head), per layer q,k,v,o + SwiGLU + 2 norms, final norm."""
  head_dim = d_model // num_heads
  kv_heads = num_kv_heads or num_heads
  attn = d_model * head_dim * (2 * num_heads + 2 * kv_heads)
  layer = attn + 3 * d_model * d_ff + 2 * d_model
  return vocab_size * d_model * (1 if tied_embeddings else 2) + num_layers * layer + d_model


def _live_bytes() -> int:
  return sum(x.nbytes for x in jax.live_arrays())


@pytest.mark.parametrize('name', SIZES)
def test_size_builds_abstractly_with_expected_params(name):
  size = SIZES[name]
  model = fdl.build(size.model())
  before = _live_bytes()
  abstract = model_stats.abstract_params(model, seq_len=size.seq_len)
  count = model_stats.param_count(model, seq_len=size.seq_len)
  assert _live_bytes() - before < 1 << 20  # eval_shape only: nothing the size of the model
  assert all(isinstance(x, jax.ShapeDtypeStruct) and x.dtype == jnp.float32
             for x in jax.tree.leaves(abstract))
  fields = {f: getattr(model, f) for f in ('vocab_size', 'num_layers', 'd_model', 'num_heads',
                                           'num_kv_heads', 'd_ff', 'tied_embeddings')}
  assert count == hand_count(**fields) == EXPECTED[name]
  assert model.use_rmsnorm and model.gated_mlp and model.rope and not model.tied_embeddings
  if name in ('1b', '8b'):
    assert model.num_kv_heads < model.num_heads  # GQA
  assert serialization.load_json(serialization.dump_json(size.model())) == size.model()


@pytest.mark.parametrize('name', SIZES)
@pytest.mark.parametrize('devices', [8, 256])
def test_recommended_mesh_shards_every_param_evenly(name, devices):
  """Every sharded parameter dim divides over the recommended mesh at 8 and 256 devices."""
  size = SIZES[name]
  cfg = fdl.build(size.mesh())
  shape = dict(zip(cfg.axes, partitioning.mesh_shape(cfg, devices)))
  rules = dict(cfg.rules)
  boxed = jax.eval_shape(fdl.build(size.model()).init, jax.random.key(0),
                         jax.ShapeDtypeStruct((1, 8), jnp.int32))
  leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  for box in leaves:
    for dim, logical in zip(box.value.shape, box.names):
      axes = rules[logical] if logical else None
      axes = axes if isinstance(axes, tuple) else (axes,)
      ways = math.prod(shape.get(a, 1) for a in axes if a)
      assert dim % ways == 0, (name, box.names, box.value.shape, shape)


def test_flops_formula():
  assert model_stats.attended_keys(4) == (1 + 2 + 3 + 4) / 4
  assert model_stats.attended_keys(5, sliding_window=2) == (1 + 2 + 2 + 2 + 2) / 5
  model = fdl.build(models.lm_8b())
  n = 32 * (4096 * 128 * 2 * (32 + 8) + 3 * 4096 * 14_336) + 4096 * 128_256
  assert model_stats.matmul_params(model) == n
  assert model_stats.flops_per_token(model, 8192) == 6 * n + 12 * 32 * 4096 * 8193 / 2


def test_flops_formula_agrees_with_xla_count():
  """XLA computes the full (unmasked) T×T scores: 3 × its forward count ≈ 6N + 12·L·d·T."""
  model = fdl.build(models.lm_tiny_llama())
  seq = 64
  xla = model_stats.train_flops_per_example(model, jax.ShapeDtypeStruct((1, seq), jnp.int32)) / seq
  full_attention = 6 * model_stats.matmul_params(model) + 12 * model.num_layers * model.d_model * seq
  assert abs(xla / full_attention - 1) < 0.05
  causal = model_stats.flops_per_token(model, seq)
  assert full_attention - causal == 12 * model.num_layers * model.d_model * (seq - (seq + 1) / 2)


def test_stats_of_other_models():
  cnn = CnnClassifier()
  images = jax.ShapeDtypeStruct((1, 28, 28), jnp.float32)
  assert model_stats.param_count(cnn, sample=images) == 1_663_370
  assert model_stats.train_flops_per_example(cnn, images) > 6 * 1_663_370
  with pytest.raises(TypeError, match='TransformerLM'):
    model_stats.flops_per_token(cnn, 8)


def test_use_size_sets_model_and_mesh():
  cfg = fdl.Config(dict, model=None, mesh=None)
  use_size(cfg, '8b')
  assert cfg.model == models.lm_8b() and fdl.build(cfg.mesh).axes == ('fsdp', 'model')
  with pytest.raises(ValueError, match='unknown size'):
    use_size(cfg, '70b')
