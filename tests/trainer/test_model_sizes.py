"""Model sizes: abstract builds with the hand-counted parameters, FLOPs, and meshes that fit."""

import math

import fiddle as fdl
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from fiddle.experimental import serialization

from paxlike.configs import models
from paxlike.configs.sizes import SIZES, use_size
from paxlike.errors import UserError
from paxlike.families import lm_flops, shapes
from paxlike.core import partitioning
from paxlike.layers import CnnClassifier, TransformerLM

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
  abstract = shapes.abstract_params(model, seq_len=size.seq_len)
  count = shapes.param_count(model, seq_len=size.seq_len)
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
  assert lm_flops.attended_keys(4) == (1 + 2 + 3 + 4) / 4
  assert lm_flops.attended_keys(5, sliding_window=2) == (1 + 2 + 2 + 2 + 2) / 5
  model = fdl.build(models.lm_8b())
  n = 32 * (4096 * 128 * 2 * (32 + 8) + 3 * 4096 * 14_336) + 4096 * 128_256
  assert lm_flops.matmul_params(model) == n
  assert lm_flops.flops_per_token(model, 8192) == 6 * n + 12 * 32 * 4096 * 8193 / 2


def test_flops_formula_agrees_with_xla_count():
  """XLA computes the full (unmasked) T×T scores: 3 × its forward count ≈ 6N + 12·L·d·T."""
  model = fdl.build(models.lm_tiny_llama())
  seq = 64
  xla = shapes.train_flops_per_example(model, jax.ShapeDtypeStruct((1, seq), jnp.int32)) / seq
  full_attention = 6 * lm_flops.matmul_params(model) + 12 * model.num_layers * model.d_model * seq
  assert abs(xla / full_attention - 1) < 0.05
  causal = lm_flops.flops_per_token(model, seq)
  assert full_attention - causal == 12 * model.num_layers * model.d_model * (seq - (seq + 1) / 2)


def test_stats_of_other_models():
  cnn = CnnClassifier()
  images = jax.ShapeDtypeStruct((1, 28, 28), jnp.float32)
  assert shapes.param_count(cnn, sample=images) == 1_663_370
  assert shapes.train_flops_per_example(cnn, images) > 6 * 1_663_370
  with pytest.raises(TypeError, match='TransformerLM'):
    lm_flops.flops_per_token(cnn, 8)


def test_use_size_sets_model_and_mesh():
  cfg = fdl.Config(dict, model=None, mesh=None)
  use_size(cfg, '8b')
  assert cfg.model == models.lm_8b() and fdl.build(cfg.mesh).axes == ('fsdp', 'model')
  with pytest.raises(ValueError, match='unknown size'):
    use_size(cfg, '70b')


LLAMAS = {'lm.Llama125M': '125m', 'lm.Llama350M': '350m', 'lm.Llama1B': '1b', 'lm.Llama8B': '8b'}


def _llama_task(key: str):
  from paxlike import registry
  from paxlike.config import config_io
  registry.import_all()
  return config_io.build(registry.get(key)().config())


@pytest.mark.parametrize('key', LLAMAS)
def test_llama_experiments_are_their_size_at_seq_2048_in_bf16(key):
  task = _llama_task(key)
  size = SIZES[LLAMAS[key]]
  assert task.model == fdl.build(size.model()) and task.mesh == fdl.build(size.mesh())
  assert task.data.seq_len == 2048 and task.model.dtype == jnp.bfloat16
  assert task.data.dataset == 'stdlib'  # A real local corpus.
  assert task.model.attention_impl == 'auto'


def test_memory_estimate_of_params_and_optimizer_matches_an_independent_count():
  """1B on 1 and 8 devices (FSDP shards every parameter): float32 params and gradients,
  AdamW's two float32 moments (plus a few scalars), split 8 ways."""
  from paxlike.families import lm_memory
  task = _llama_task('lm.Llama1B')
  n = EXPECTED['1b']
  for devices in (1, 8):
    est = lm_memory.estimate(task, devices)
    assert est.mesh == {'fsdp': devices}
    assert est.params == est.gradients == n * 4 / devices
    assert 2 * n * 4 / devices <= est.optimizer < (2 * n * 4 + 1024) / devices


def test_memory_estimate_of_activations_by_hand():
  """A 2-layer d64 model (4 heads of 16, 2 kv heads, SwiGLU 128, vocab 256) in bf16. 'dots'
  keeps per layer its input 64, q 64, k and v 2·32, the attention projection 64, gate and up
  2·128 = 512 elements. 'none' keeps as well a norm output, rotated q and k and the attention
  output (64 + 3·64), both norms' float32 residuals (2·3·64 float32) and a flash kernel's
  float32 log-sum-exp (4 heads): 1032 bytes, plus the MLP's activation, product (2·256): 1024.
  The backward pass's peak adds the larger of one layer's recompute and the head: float32 and
  bf16 logits (6·256) and the final norm's residuals and output (12·64 + 2·64) = 2432 bytes."""
  from paxlike.families import lm_memory
  model = TransformerLM(vocab_size=256, num_layers=2, d_model=64, num_heads=4, num_kv_heads=2,
                        d_ff=128, dtype=jnp.bfloat16, remat_policy='dots')
  head = 6 * 256 + 14 * 64
  assert lm_memory.head_bytes_per_token(model) == head == 2432
  rest = (64 + 3 * 64) * 2 + 2 * 3 * 64 * 4 + 4 * 4 + 2 * 256 * 2  # 3088
  dots = 512 * 2
  assert lm_memory.activation_bytes_per_token(model, 32, 'cudnn') == 2 * dots + max(rest - 16,
                                                                                  head)
  full = model.clone(remat_policy='full')
  assert lm_memory.activation_bytes_per_token(full, 32, 'cudnn') == (
      2 * 64 * 2 + max(dots + rest - 64 * 2 - 16, head))
  # 'none' with XLA attention keeps each layer's whole [4, 32, 32] scores in float32 and bf16
  # instead of the log-sum-exp; its backward then works on three float32 copies of them
  # (3·4·4·32 = 1536 bytes), less than the head.
  none = model.clone(remat_policy='none')
  assert (lm_memory.activation_bytes_per_token(none, 32, 'xla')
          - lm_memory.activation_bytes_per_token(none, 32, 'cudnn')) == 2 * (4 * 32 * 6 - 16)


@pytest.mark.slow
def test_print_config_of_the_8b_prints_the_memory_per_device():
  from tests.helpers import run_cli
  out = run_cli('--exp=lm.Llama8B', '--mode=print_config').stdout
  lines = [l for l in out.splitlines() if l.startswith('# memory per device')]
  assert [l.split(' devices')[0] for l in lines] == [
      '# memory per device on 8', '# memory per device on 64', '# memory per device on 256']
  assert '(fsdp 16 × model 4)' in lines[1] and '# params: 8,030,261,248' in out


def test_pipeline_activations_are_the_stages_share_over_the_microbatch_iterations():
  """2 stages of 4 microbatches: a device keeps its 1 of 2 layers for 4 + 2 − 1 = 5 iterations
  of a quarter batch, 5/8 of the stack's 'dots' activations per token; the head is whole (and
  larger than a microbatch's recompute, 3072 / 4 bytes per token of the batch)."""
  from paxlike.families import lm_memory
  model = TransformerLM(vocab_size=256, num_layers=2, d_model=64, num_heads=4, num_kv_heads=2,
                        d_ff=128, dtype=jnp.bfloat16, remat_policy='dots')
  head = 6 * 256 + 14 * 64
  assert lm_memory.activation_bytes_per_token(model, 32, 'cudnn', stages=2, microbatches=4) == (
      2 * 512 * 2 * 5 / 8 + head)
  assert lm_memory.pipeline_share(1, 1) == 1 and lm_memory.pipeline_share(4, 16) == 19 / 64


def test_the_pod_pipeline_size_splits_the_layers_over_stages_and_the_rest_over_fsdp_model():
  """8b_pipeline on 64 devices (stage 4 × fsdp 4 × model 4): the stacked layers' float32 kernels
  split 64 ways and their norms 16 (stage × fsdp); the embeddings and head (outside the pipeline)
  16 ways (fsdp × model) and the final norm 4."""
  from paxlike.configs import fiddlers
  from paxlike import registry
  from paxlike.config import config_io
  from paxlike.families import lm_memory
  registry.import_all()
  config = registry.get('lm.Llama8B')().config()
  fiddlers.size_8b_pipeline(config)
  task = config_io.build(config)
  assert task.train.microbatches == 16
  est = lm_memory.estimate(task, 64)
  assert est.mesh == {'stage': 4, 'fsdp': 4, 'model': 4}
  m = task.model
  kv = m.num_kv_heads * m.d_model // m.num_heads
  kernels = m.d_model * (2 * m.d_model + 2 * kv) + 3 * m.d_model * m.d_ff
  tables = 2 * m.vocab_size * m.d_model
  assert est.params == pytest.approx(4 * (m.num_layers * (kernels / 64 + 2 * m.d_model / 16)
                                          + tables / 16 + m.d_model / 4))
  with pytest.raises(UserError, match='does not divide 8 devices'):
    lm_memory.estimate(task, 8)  # 4 stages × 4 model need a multiple of 16 devices.


@pytest.mark.slow
def test_print_config_of_the_pod_pipeline_prints_its_memory_per_device():
  from tests.helpers import run_cli
  out = run_cli('--exp=lm.Llama8B', '--fdl_fiddler=size_8b_pipeline', '--mode=print_config').stdout
  lines = [l for l in out.splitlines() if l.startswith('# memory per device')]
  assert [l.split(':')[0] for l in lines] == [
      '# memory per device on 64 devices (stage 4 × fsdp 4 × model 4)',
      '# memory per device on 256 devices (stage 4 × fsdp 16 × model 4)']
  assert 'microbatches = 16' in out or 'microbatches=16' in out.replace(' ', '')
