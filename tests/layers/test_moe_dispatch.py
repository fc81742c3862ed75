"""Dropless MoE by grouping (layers/moe_dispatch.py) against the capped path at C = T slots
(every expert could take the whole row: today's dropless computation, exact by construction):
the same outputs and gradients, at a fraction of the FLOPs (XLA's cost analysis), on one
device and on expert meshes."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.layers import moe, moe_dispatch
from tests.helpers import run_script

D, F, E = 8, 16, 4


@pytest.mark.parametrize('block', [1, 4])
def test_plan_groups_rows_by_expert_in_padded_blocks(block):
  experts = np.array([2, 0, 2, 3, 0, 2, 2, 0, 3, 2, 0], np.int32)
  p = jax.jit(moe_dispatch.plan, static_argnums=(1, 2))(jnp.asarray(experts), E, block)
  dest, sizes, block_expert = map(np.asarray, (p.dest, p.sizes, p.block_expert))
  counts = np.bincount(experts, minlength=E)
  padded = -(-counts // block) * block
  np.testing.assert_array_equal(sizes, padded)
  starts = np.cumsum(padded) - padded
  for e in range(E):  # Expert e's rows fill its group's first slots, in row order.
    np.testing.assert_array_equal(dest[experts == e], starts[e] + np.arange(counts[e]))
  assert len(set(dest.tolist())) == len(dest)
  assert len(block_expert) == moe_dispatch.num_blocks(len(experts), E, block)
  for i, e in enumerate(block_expert):
    if i * block < padded.sum():
      assert starts[e] <= i * block < starts[e] + padded[e]


def _pair(k: int, impl: str, **kw):
  """(dropless layer, the capped layer at C = T) with the same params."""
  return moe.MoeMlp(F, E, k, None, dispatch=impl, **kw), moe.MoeMlp(F, E, k, E / k, **kw)


def _out_and_grads(layer, params, x):
  def loss(p, x):
    y, stats = layer.apply({'params': p}, x, mutable=[moe.COLLECTION])
    return jnp.sum(jnp.sin(y)) + moe.summarize(stats[moe.COLLECTION])['loss'], y
  (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, x)
  return y, grads


VARIANTS = {
    'mixtral': dict(k=2),
    'switch': dict(k=1),
    'plain_mlp_k3': dict(k=3, gated=False, activation='gelu'),
    'shared_expert': dict(k=2, shared_d_ff=6, renormalize=False),
    'lora': dict(k=2, lora_rank=2, lora_targets=('wi_gate', 'wo')),
}


@pytest.mark.parametrize('impl', ['blocks', 'ragged'])
@pytest.mark.parametrize('variant', VARIANTS)
def test_dropless_equals_every_expert_on_every_token(variant, impl):
  kw = dict(VARIANTS[variant])
  new, old = _pair(kw.pop('k'), impl, **kw)
  x = jax.random.normal(jax.random.key(0), (3, 10, D))
  params = nn.unbox(jax.jit(new.init)(jax.random.key(1), x))['params']
  params = jax.tree.map(lambda a: a + 0.05, params)  # LoRA's B moves off 0.
  (y, grads), (want_y, want_grads) = _out_and_grads(new, params, x), _out_and_grads(old, params, x)
  np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_every_token_on_one_expert_fills_the_buffer_and_stays_exact():
  """The most padding a routing can need: all rows in one group (the buffer's bound is tight)."""
  new, old = _pair(2, 'blocks')
  x = jax.random.normal(jax.random.key(0), (2, 40, D)).at[..., 0].set(5.0)
  params = nn.unbox(jax.jit(new.init)(jax.random.key(1), x))['params']
  params['router'] = jnp.zeros((D, E)).at[0, 1].set(4.0).at[0, 3].set(2.0)
  y, stats = jax.jit(new.apply, static_argnames='mutable')({'params': params}, x,
                                                           mutable=(moe.COLLECTION,))
  np.testing.assert_allclose(y, jax.jit(old.apply)({'params': params}, x), rtol=1e-5,
                             atol=1e-5)
  stats = moe.summarize(stats[moe.COLLECTION])
  assert float(stats['max_load']) == 0.5 and float(stats['dropped']) == 0.0


def _step_flops(layer, x) -> float:
  params = nn.unbox(jax.eval_shape(layer.init, jax.random.key(1), x))['params']
  grad = jax.jit(jax.grad(lambda p, x: jnp.sum(layer.apply({'params': p}, x)), argnums=(0, 1)))
  return float(grad.lower(params, x).compile().cost_analysis()['flops'])


def test_dropless_costs_its_active_experts_not_every_expert():
  """E = 8, k = 2: the capped path at C = T runs 8 experts on every token; grouping runs 2
  (plus at most a quarter of padding), so a train step's FLOPs fall by well over half."""
  x = jax.ShapeDtypeStruct((4, 128, 32), jnp.float32)
  dropless = _step_flops(moe.MoeMlp(64, 8, 2, None, dispatch='blocks'), x)
  every = _step_flops(moe.MoeMlp(64, 8, 2, 4.0), x)
  assert dropless < 0.45 * every, (dropless, every)


def test_unknown_dispatch_is_refused():
  with pytest.raises(ValueError, match="dispatch must be one of 'auto', 'blocks', 'ragged'"):
    moe.MoeMlp(F, E, 2, None, dispatch='dense').init(jax.random.key(0), jnp.ones((1, 4, D)))


MESH_SCRIPT = '''
import json
import flax.linen as nn, jax, jax.numpy as jnp, numpy as np
from paxlike.core import partitioning
from paxlike.core.partitioning import MeshConfig
from paxlike.layers import moe
x = np.random.default_rng(0).normal(size=(8, 64, 16)).astype(np.float32)
out = {}
for impl, cf in (('blocks', None), ('ragged', None), ('every', 4.0)):
  layer = moe.MoeMlp(24, 8, 2, cf, **({} if cf else {'dispatch': impl}))
  loss = lambda p, x: jnp.sum(jnp.sin(layer.apply({'params': p}, x)))
  for name, cfg in {'one': MeshConfig(ici=(1,)),
                    'data2_expert4': MeshConfig((2, 4), None, ('data', 'expert')),
                    'fsdp2_expert2_model2': MeshConfig((2, 2, 2), None,
                                                       ('fsdp', 'expert', 'model'))}.items():
    mesh = partitioning.make_mesh(cfg, jax.devices()[:1] if name == 'one' else None)
    with jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.rules_for_mesh(cfg.rules, mesh)):
      boxed = jax.eval_shape(layer.init, jax.random.key(0), x)['params']
      shard = partitioning.logical_shardings(boxed, mesh, cfg.rules)
      params = jax.jit(lambda k: nn.unbox(layer.init(k, x))['params'],
                       out_shardings=shard)(jax.random.key(0))
      step = jax.jit(jax.value_and_grad(loss))
      flops = step.lower(params, x).compile().cost_analysis()['flops']
      y, grads = step(params, x)
      out[impl + '/' + name] = {'loss': float(y), 'wo_spec': str(params['wo'].sharding.spec),
                                'flops': float(flops),
                                'grads': [np.asarray(g).tolist() for g in jax.tree.leaves(grads)]}
print(json.dumps(out))
'''


@pytest.mark.slow
def test_dropless_on_expert_meshes_equals_one_device_and_every_expert():
  """With the experts' weights split on 'expert' (2 data × 4 expert, 2 fsdp × 2 expert × 2
  model), both grouped matmuls give one device's loss and gradients, and those of the capped
  path at C = T; per device, the grouped step costs fewer FLOPs than the every-expert one."""
  out = json.loads(run_script(MESH_SCRIPT).strip().splitlines()[-1])
  want = out['every/one']
  for name, got in out.items():
    np.testing.assert_allclose(got['loss'], want['loss'], rtol=1e-5, err_msg=name)
    for g, w in zip(got['grads'], want['grads']):
      np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=name)
    assert name.endswith('/one') or "'expert'" in got['wo_spec'], (name, got['wo_spec'])
  # Each device sorts and computes its own batch shard's tokens: a device's program costs a
  # fraction of the every-expert one's (the grouping replicated on every device cost 1.8x).
  for mesh in ('one', 'data2_expert4'):
    every = out[f'every/{mesh}']['flops']
    assert out[f'blocks/{mesh}']['flops'] < 0.7 * every, (mesh, out[f'blocks/{mesh}'], every)


def test_auto_keeps_the_slots_path_where_the_mesh_splits_the_experts():
  """The grouped matmuls gather every expert's weights to each device: on an expert-split mesh
  'auto' keeps the capped path at a slot per token, which equals the grouped one."""
  assert moe_dispatch.resolve('auto', expert_shards=4) == 'slots'
  assert moe_dispatch.resolve('auto', groups=2, expert_shards=1) == 'blocks'
  x = jax.random.normal(jax.random.key(1), (2, 16, D))
  slots, every = moe.MoeMlp(F, E, 2, None, dispatch='slots'), moe.MoeMlp(F, E, 2, E / 2)
  grouped = moe.MoeMlp(F, E, 2, None, dispatch='blocks')
  params = jax.jit(slots.init)(jax.random.key(0), x)
  np.testing.assert_array_equal(jax.jit(slots.apply)(params, x), jax.jit(every.apply)(params, x))
  np.testing.assert_allclose(jax.jit(grouped.apply)(params, x), jax.jit(slots.apply)(params, x),
                             rtol=1e-5, atol=1e-6)
