"""Decoding with the params sharded over an 8-device CPU mesh (FSDP x tensor parallel): the same
greedy tokens as on one device, also through traces kept in a program store, with the cache
split like the kv activations; for an unrolled stack and a scanned one decoded by a scan, by a
loop over its layers and unrolled (its params split per layer under the mesh)."""

import textwrap

from tests.helpers import run_script

SCRIPT = textwrap.dedent("""
    import pathlib, tempfile
    import flax.linen as nn, jax, jax.numpy as jnp, numpy as np
    from paxlike.core import partitioning
    from paxlike.core import program_store
    from paxlike.decode import engine, generate
    from paxlike.layers import TransformerLM, stack_layers
    from paxlike.core.partitioning import MeshConfig
    assert jax.device_count() == 8
    cfg = MeshConfig(ici=(2, 4), axes=('fsdp', 'model'))
    mesh = partitioning.make_mesh(cfg)
    rules = partitioning.rules_for_mesh(cfg.rules, mesh)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 128, n).astype(np.int32) for n in (5, 11, 2)]
    for scan, way in ((False, 'scan'), (True, 'scan'), (True, 'loop'), (True, 'unrolled')):
      model = TransformerLM(vocab_size=128, num_layers=2, d_model=64, num_heads=8, num_kv_heads=4,
                            d_ff=128, max_len=64, tied_embeddings=False, scan_layers=scan,
                            decode_layers=way)
      init = jnp.zeros((1, 4), jnp.int32)
      params = nn.unbox(model.clone(scan_layers=False).init(jax.random.key(0), init))['params']
      params = jax.tree.map(lambda x: x * 2.0, params)
      params = stack_layers(params, 2) if scan else params
      want = generate(model, params, prompts, max_new_tokens=12)
      with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        boxed = jax.eval_shape(model.init, jax.random.key(0), init)
      shardings = partitioning.logical_shardings(boxed, mesh, cfg.rules)['params']
      sharded = jax.device_put(params, shardings)
      local = sum(x.addressable_shards[0].data.size for x in jax.tree.leaves(sharded))
      assert local <= sum(x.size for x in jax.tree.leaves(sharded)) / 4, local
      got = generate(model, sharded, prompts, max_new_tokens=12, mesh=mesh, rules=cfg.rules)
      for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
      # Its traces kept in a program store, then read back, give those tokens too.
      store = program_store.Store(pathlib.Path(tempfile.mkdtemp()))
      for _ in range(2):
        engine.decoder.cache_clear()
        kept = generate(model, sharded, prompts, max_new_tokens=12, mesh=mesh, rules=cfg.rules,
                        store=store)
        for g, w in zip(kept, want):
          np.testing.assert_array_equal(g, w)
      assert len(list(store.directory.glob('*.jaxexport'))) == 2
      # The cache: batch over 'fsdp', kv heads over 'model', as the kv activations.
      options = engine.Options(64)
      run = engine.decoder(model, options, mesh, rules)
      tokens, lengths = engine.left_pad(prompts + [prompts[0]], 0)
      state = run.prefill(sharded, tokens, lengths, np.ones(4, bool), jax.random.key(0))
      # One cache for the stack, layers first (decoder() takes the model as given: unrolling
      # is generate's layout, checked above).
      stacked = scan and way != 'loop'
      layer = 'blocks' if stacked else 'layer_0' if scan else 'block_0'
      spec = tuple(state.cache[layer]['attention']['key'].sharding.spec) + (None,) * 5
      assert spec[int(stacked):int(stacked) + 4] == ('fsdp', 'model', None, None), spec
      print('scan', scan, way, 'cache spec', spec[:4 + int(stacked)])
    print('SHARDED_DECODE_OK')
""")


def test_sharded_params_decode_like_one_device_with_the_cache_sharded_like_kv():
  assert 'SHARDED_DECODE_OK' in run_script(SCRIPT)
