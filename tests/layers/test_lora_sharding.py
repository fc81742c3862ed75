"""LoRA on an 8-device CPU mesh (FSDP x tensor parallel): adapters take their kernel's shardings
(rank replicated) and the loss and gradients equal one device's."""

import textwrap

from tests.helpers import run_script

SCRIPT = textwrap.dedent("""
    import flax.linen as nn, jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from paxlike.core import partitioning
    from paxlike.trainer import losses
    from paxlike.layers import TransformerLM, lora
    from paxlike.core.partitioning import MeshConfig
    # The rank axis is replicated; partitioning.DEFAULT_RULES may not name it yet.
    rules = partitioning.DEFAULT_RULES
    if 'lora_rank' not in dict(rules):
      rules = rules + (('lora_rank', None),)
    model = TransformerLM(vocab_size=128, num_layers=2, d_model=64, num_heads=8, num_kv_heads=4,
                          d_ff=128, lora_rank=4, scan_layers=True,
                          lora_targets=('query', 'key', 'value', 'out', 'wi_gate', 'wi_up', 'wo'))
    windows = jax.random.randint(jax.random.key(1), (8, 17), 0, 128, dtype=jnp.int32)
    batch = {'inputs': windows[:, :-1], 'targets': windows[:, 1:], 'mask': jnp.ones((8, 16))}
    params = nn.unbox(jax.jit(model.init)(jax.random.key(0), batch['inputs']))['params']
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x + 0.05 if str(path[-1].key).endswith('_lora_b') else x, params)
    loss_fn = jax.jit(jax.value_and_grad(lambda p, b: losses.model_loss_fn(model)(p, b, None)[0]))
    ref_loss, ref_grads = loss_fn(params, batch)
    cfg = MeshConfig(ici=(2, 4), axes=('fsdp', 'model'), rules=rules)
    mesh = partitioning.make_mesh(cfg)
    with jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.rules_for_mesh(rules, mesh)):
      boxed = jax.eval_shape(model.init, jax.random.key(0), batch['inputs'])
      shardings = partitioning.logical_shardings(boxed, mesh, rules)['params']
      sharded = jax.device_put(params, shardings)
      data = jax.device_put(batch, NamedSharding(mesh, P('fsdp')))
      loss, grads = loss_fn(sharded, data)
    attention = shardings['blocks']['attention']
    assert tuple(attention['query_lora_a'].spec) == (None, 'fsdp', None), attention['query_lora_a']
    assert tuple(attention['query_lora_b'].spec)[:3] == (None, None, 'model')
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
      np.testing.assert_allclose(g, r, atol=2e-6, rtol=1e-4)
    mask = lora.lora_mask(grads)
    assert any(jax.tree.leaves(mask)) and not all(jax.tree.leaves(mask))
    print('LORA_SHARDING_OK')
""")


def test_lora_adapters_shard_like_their_kernels_and_match_one_device():
  assert 'LORA_SHARDING_OK' in run_script(SCRIPT)
