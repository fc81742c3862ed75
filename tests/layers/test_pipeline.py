"""GPipe over a 'stage' mesh axis gives the unpipelined stack's outputs, loss and gradients."""

import json
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh

from paxlike.errors import UserError
from paxlike.layers import pipeline
from tests.helpers import cli_env, run_module, run_script

# A TransformerLM (scan_layers=True) whose 4 DecoderBlocks run as a 4-stage pipeline on a 4 stage
# x 2 data mesh, on a packed batch (segment ids and positions travel with each microbatch), each
# layer rematerialised; then an 8-layer MLP stack on 2 stage x 2 data x 2 fsdp with FSDP-sharded
# weights, and in circular schedules of 2 passes over 2 and 4 stages.
SCRIPT = textwrap.dedent("""
    import flax.linen as nn, jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    from paxlike.layers import TransformerLM, pipeline
    from paxlike.layers.attention import CausalSelfAttention
    from paxlike.layers.blocks import DecoderBlock
    assert jax.device_count() == 8
    auto = lambda shape, axes: jax.make_mesh(shape, axes, axis_types=(AxisType.Auto,) * len(axes))
    close = lambda a, b, msg: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=msg)

    model = TransformerLM(vocab_size=64, num_layers=4, d_model=32, num_heads=4, num_kv_heads=2,
                          d_ff=64, scan_layers=True, attention_impl='xla')
    block = DecoderBlock(CausalSelfAttention(num_heads=4, num_kv_heads=2, head_dim=8,
                                             implementation='xla', parent=None), d_ff=64)
    tokens = jax.random.randint(jax.random.key(1), (8, 9), 0, 64, dtype=jnp.int32)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    seg = jnp.repeat(jnp.array([[1] * 5 + [2] * 3]), 8, 0)
    pos = jnp.repeat(jnp.array([[0, 1, 2, 3, 4, 0, 1, 2]]), 8, 0)
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), inputs))['params']

    def xent(logits):
      logp = jax.nn.log_softmax(logits)
      return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], -1))

    def model_loss(params):
      return xent(model.apply({'params': params}, inputs, segment_ids=seg, positions=pos))

    def layer(p, x, extra):
      return block.apply({'params': p}, x, True, False, None, *extra)

    def pipelined_loss(params, mesh):
      x = params['embed']['embedding'][inputs]
      x = pipeline.pipelined_layers(layer, params['blocks'], x, (seg, pos), microbatches=2,
                                    mesh=mesh, remat=True)
      x = nn.RMSNorm().apply({'params': params['final_norm']}, x)
      return xent(x @ params['embed']['embedding'].T)

    ref_loss, ref_grads = jax.jit(jax.value_and_grad(model_loss))(params)
    mesh = auto((4, 2), ('stage', 'data'))
    rules = [('batch', 'data'), ('layers', 'stage'), ('embed', None), ('mlp', None),
             ('heads', None), ('kv_heads', None), ('kv', None), ('length', None), ('vocab', None)]
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      boxed = jax.eval_shape(model.init, jax.random.key(0), inputs)['params']
      sharded = jax.device_put(params, nn.logical_to_mesh_sharding(
          nn.get_partition_spec(boxed), mesh, rules))
      step = jax.jit(jax.value_and_grad(pipelined_loss), static_argnums=1)
      hlo = step.lower(sharded, mesh).compile().as_text()
      loss, grads = step(sharded, mesh)
    assert sharded['blocks']['mlp']['wo']['kernel'].sharding.spec[0] == 'stage'
    assert 'collective-permute' in hlo
    close(loss, ref_loss, 'loss')
    for (path, g), r in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(ref_grads)):
      close(g, r, jax.tree_util.keystr(path))

    # The MLP stacks run in float64, so the check measures the schedule and not float32 rounding:
    # in float32 the pipelined and the scanned gradients each differ from float64 truth by
    # ~1.5e-5, and from each other by up to 2.7e-5 on JAX 0.10 (2.9e-6 on 0.12); in float64, 4e-15.
    jax.config.update('jax_enable_x64', True)
    close = lambda a, b, msg: np.testing.assert_allclose(a, b, atol=1e-12, rtol=1e-12, err_msg=msg)

    def mlp(p, x, scale):
      return x + scale * jnp.tanh(x @ p['w1']) @ p['w2']

    keys = jax.random.split(jax.random.key(2), 3)
    stack = {'w1': jax.random.normal(keys[0], (8, 16, 32)) / 4,
             'w2': jax.random.normal(keys[1], (8, 32, 16)) / 8}
    x = jax.random.normal(keys[2], (16, 16))
    scale = jnp.linspace(0.5, 1.5, 16)[:, None]
    loss_of = lambda run: (lambda s, x: jnp.sum(jnp.sin(run(s, x))))
    scanned = lambda s, x: pipeline.scan_layers(mlp, s, x, scale)
    ref_y = jax.jit(scanned)(stack, x)
    ref_g = jax.jit(jax.grad(loss_of(scanned), argnums=(0, 1)))(stack, x)
    # (mesh, microbatches, repeats): GPipe under FSDP; circular, 2 passes of 4 or 2 chunks.
    for shape, axes, m, r in [((2, 2, 2), ('stage', 'data', 'fsdp'), 4, 1),
                              ((2, 4), ('stage', 'data'), 2, 2), ((4, 2), ('stage', 'data'), 4, 2)]:
      mesh = auto(shape, axes)
      piped = lambda s, x: pipeline.pipelined_layers(mlp, s, x, scale, microbatches=m,
                                                     mesh=mesh, repeats=r)
      batch = tuple(a for a in axes if a != 'stage')
      sharded = jax.device_put(stack, NamedSharding(mesh, P('stage', 'fsdp' if r == 1 else None)))
      xs = jax.device_put(x, NamedSharding(mesh, P(batch)))
      y = jax.jit(piped)(sharded, xs)
      g = jax.jit(jax.grad(loss_of(piped), argnums=(0, 1)))(sharded, xs)
      assert y.sharding.spec[0] == (batch if len(batch) > 1 else batch[0]), y.sharding
      assert y.dtype == jnp.float64 and all(a.dtype == jnp.float64 for a in jax.tree.leaves(g))
      close(y, ref_y, f'mlp y {shape} {m} {r}')
      for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(ref_g)):
        close(a, b, f'mlp grads {shape} {m} {r}')
    print('PIPELINE_OK')
""")


def test_pipelined_lm_and_fsdp_stack_match_unpipelined():
  assert 'PIPELINE_OK' in run_script(SCRIPT, timeout=240)


def _idle_share(stages: int, microbatches: int, repeats: int) -> float:
  """The share of (stage, iteration) slots of the schedule with no microbatch pass to run:
  stage s runs pass t - s of the repeats x microbatches passes, one per iteration."""
  iterations = repeats * microbatches + stages - 1
  busy = sum(0 <= t - s < repeats * microbatches for t in range(iterations)
             for s in range(stages))
  return 1 - busy / (stages * iterations)


@pytest.mark.parametrize('stages,microbatches,repeats',
                         [(1, 4, 1), (2, 4, 1), (4, 4, 1), (4, 8, 1), (8, 3, 1), (4, 4, 2)])
def test_bubble_fraction_counts_idle_slots_of_the_schedule(stages, microbatches, repeats):
  assert pipeline.bubble_fraction(stages, microbatches, repeats) == pytest.approx(
      _idle_share(stages, microbatches, repeats))


def _mlp(p, x, extra):
  return jnp.tanh(x @ p)


def test_no_stage_axis_is_the_plain_scan():
  stack = jax.random.normal(jax.random.key(0), (3, 8, 8))
  x = jax.random.normal(jax.random.key(1), (4, 8))
  y = pipeline.pipelined_layers(_mlp, stack, x, microbatches=2,
                                mesh=AbstractMesh((1,), ('data',)))
  ref = x
  for w in stack:
    ref = jnp.tanh(ref @ w)
  np.testing.assert_allclose(y, ref, atol=1e-6)


@pytest.mark.parametrize('layers,batch,microbatches,repeats,match', [
    (6, 16, 2, 1, r"mesh axis 'stage' of size 4 does not divide model.num_layers=6"),
    (8, 16, 3, 1, r'train.microbatches=3 does not divide the per-stage batch: batch 16 over 2 '
                  r'data-parallel devices is 8 rows per device'),
    (8, 16, 0, 1, r'train.microbatches must be >= 1, got 0'),
    (12, 16, 4, 2, r'a circular pipeline of 2 repeats over 4 stages needs num_layers \(12\) a '
                   r'multiple of 8 and microbatches \(4\) >= 4'),
    (8, 16, 2, 2, r'a circular pipeline of 2 repeats over 4 stages needs num_layers \(8\) a '
                  r'multiple of 8 and microbatches \(2\) >= 4'),
])
def test_bad_input_is_one_user_error_line(layers, batch, microbatches, repeats, match):
  with pytest.raises(UserError, match=match) as caught:
    pipeline.check_pipeline(num_layers=layers, stages=4, batch_size=batch,
                            microbatches=microbatches, batch_shards=2, repeats=repeats)
  assert '\n' not in str(caught.value)
  # The pipeline itself refuses the same input while tracing, before anything compiles.
  mesh = AbstractMesh((4, 2), ('stage', 'data'))
  with pytest.raises(UserError, match=match):
    jax.eval_shape(lambda s, x: pipeline.pipelined_layers(
        _mlp, s, x, microbatches=microbatches, mesh=mesh, repeats=repeats),
        jax.ShapeDtypeStruct((layers, 8, 8), jnp.float32),
        jax.ShapeDtypeStruct((batch, 8), jnp.float32))


def test_benchmark_quick_prints_bubbles_against_the_formula():
  proc = run_module('benchmarks.pipeline', '--quick', '--circular=2',
                    env=cli_env(1, JAX_PLATFORMS='cpu'), timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out['benchmark'] == 'pipeline' and out['devices'] == 8 and out['quick']
  points = {(q['stages'], q['microbatches'], q['repeats']): q for q in out['points']}
  assert set(points) == {(2, 2, 1), (2, 4, 1), (2, 2, 2), (2, 4, 2)}
  for (p, m, r), q in points.items():
    assert q['bubble_gpipe'] == pytest.approx((p - 1) / (r * m + p - 1))
    assert q['mesh'] == {'stage': p, 'data': 8 // p}
    assert 0 < q['cpu_ms_no_bubble'] and 0 < q['cpu_ms_pipelined']
    assert q['bubble_measured'] == pytest.approx(1 - q['cpu_ms_no_bubble'] / q['cpu_ms_pipelined'])
  assert [s['microbatches'] for s in out['slope']] == [2, 4]
