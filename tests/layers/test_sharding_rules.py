"""Data, FSDP and tensor parallelism (and mixes) on 8 forced CPU devices give 1-device losses."""

import textwrap

from tests.helpers import run_script

SCRIPT = textwrap.dedent("""
    import flax.linen as nn, jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from paxlike.core import partitioning
    from paxlike.trainer import losses
    from paxlike.errors import UserError
    from paxlike.layers import TransformerLM
    from paxlike.layers.transformer import stack_layers
    from paxlike.core.partitioning import MeshConfig
    assert jax.device_count() == 8
    base = TransformerLM(vocab_size=128, num_layers=2, d_model=64, num_heads=8, num_kv_heads=4,
                         d_ff=128, tied_embeddings=False, qk_norm=True)
    windows = jax.random.randint(jax.random.key(1), (8, 17), 0, 128, dtype=jnp.int32)
    batch = {'inputs': windows[:, :-1], 'targets': windows[:, 1:], 'mask': jnp.ones((8, 16))}
    params = nn.unbox(jax.jit(base.init)(jax.random.key(0), batch['inputs']))['params']
    trees = {False: params, True: stack_layers(params, 2)}

    def loss_and_grads(model, p, b):
      return jax.jit(jax.value_and_grad(lambda p, b: losses.model_loss_fn(model)(p, b, None)[0]))(p, b)

    refs = {scan: loss_and_grads(base.clone(scan_layers=scan), trees[scan], batch) for scan in trees}
    # name: (ici, axes, devices, scan_layers, params bytes per device / total: (low, high))
    MESHES = {
        'data': ((8,), ('data',), 8, False, (1.0, 1.0)),
        'fsdp': ((8,), ('fsdp',), 8, True, (0.125, 0.126)),  # qk-norm scales: replicated
        'model': ((4,), ('model',), 4, False, (0.25, 0.26)),
        'data_model': ((2, 4), ('data', 'model'), 8, True, (0.25, 0.26)),
        'fsdp_model': ((2, 4), ('fsdp', 'model'), 8, False, (0.125, 0.13)),
        'data_fsdp_model': ((2, 2, 2), ('data', 'fsdp', 'model'), 8, True, (0.25, 0.26)),
    }
    for name, (ici, axes, n, scan, (low, high)) in MESHES.items():
      cfg = MeshConfig(ici=ici, axes=axes)
      mesh = partitioning.make_mesh(cfg, jax.devices()[:n])
      model = base.clone(scan_layers=scan)
      with jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.rules_for_mesh(cfg.rules, mesh)):
        boxed = jax.eval_shape(model.init, jax.random.key(0), batch['inputs'])
        shardings = partitioning.logical_shardings(boxed, mesh, cfg.rules)['params']
        sharded = jax.device_put(trees[scan], shardings)
        data = jax.device_put(batch, NamedSharding(mesh, P(partitioning.batch_axes(mesh) or None)))
        loss, grads = loss_and_grads(model, sharded, data)
      ref_loss, ref_grads = refs[scan]
      np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, err_msg=name)
      for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_allclose(g, r, atol=2e-6, rtol=1e-4, err_msg=name)
      local = sum(x.addressable_shards[0].data.size for x in jax.tree.leaves(sharded))
      total = sum(x.size for x in jax.tree.leaves(sharded))
      assert low <= local / total <= high, (name, local / total)
      wo = sharded['blocks' if scan else 'block_0']['mlp']['wo']['kernel'].sharding.spec
      expect_mlp = 'model' if 'model' in axes else None
      expect_embed = 'fsdp' if 'fsdp' in axes else None
      assert tuple(wo)[-2:] == (expect_mlp, expect_embed), (name, wo)
      print(name, 'loss', float(loss), 'local fraction', round(local / total, 4))
    # A scanned model's 'layers' axis needs a rule like any other.
    rules = tuple(r for r in partitioning.DEFAULT_RULES if r[0] != 'layers')
    mesh = partitioning.make_mesh(MeshConfig(ici=(8,), axes=('fsdp',)))
    try:
      partitioning.logical_shardings(
          jax.eval_shape(base.clone(scan_layers=True).init, jax.random.key(0), batch['inputs']),
          mesh, rules)
      raise AssertionError('no error for a missing rule')
    except UserError as e:
      assert "'layers'" in str(e), e
    print('SHARDING_OK')
""")


def test_fsdp_tensor_and_data_parallel_match_one_device():
  assert 'SHARDING_OK' in run_script(SCRIPT)
