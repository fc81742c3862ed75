"""The families' routers in `moe.MoeMlp` against the float64 numpy reference of
tests/interop/moe_reference.py: Mixtral (softmax, top-k, renormalised), Qwen-MoE with and
without `norm_topk_prob`, Qwen2-MoE's sigmoid-gated shared expert, and a dropless capacity that
keeps every token however unbalanced the routing is."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from paxlike.families import lm_flops
from paxlike.layers import TransformerLM, lora, moe, stack_layers
from tests.interop import moe_reference as ref

D, F, E = 16, 8, 4


def pax_params(block: ref.SparseMoe) -> dict:
  """MoeMlp params holding a reference block's weights (HF [out, in] -> paxlike [in, out])."""
  stack = lambda name: jnp.asarray(np.stack([getattr(e, name).T for e in block.experts]),
                                   jnp.float32)
  params = {'router': jnp.asarray(block.router.T, jnp.float32), 'wi_gate': stack('gate'),
            'wi_up': stack('up'), 'wo': stack('down')}
  if block.shared is not None:
    kernel = lambda w: {'kernel': jnp.asarray(w.T, jnp.float32)}
    params['shared_expert'] = {'wi_gate': kernel(block.shared.gate),
                               'wi_up': kernel(block.shared.up), 'wo': kernel(block.shared.down)}
    params['shared_gate'] = jnp.asarray(block.shared_gate.T, jnp.float32)
  return params


def run_layer(layer: moe.MoeMlp, block: ref.SparseMoe, x: np.ndarray):
  """(output, summarized statistics) of `layer` holding `block`'s weights."""
  y, stats = jax.jit(layer.apply, static_argnames=('mutable',))(
      {'params': pax_params(block)}, jnp.asarray(x, jnp.float32), mutable=(moe.COLLECTION,))
  return np.asarray(y), moe.summarize(stats[moe.COLLECTION])


@pytest.mark.parametrize('k, norm_topk, shared_f', [
    (2, True, 0),    # Mixtral.
    (1, True, 0),    # Top-1 renormalised: the one expert's weight is 1.
    (2, False, 0),   # Qwen3-MoE with norm_topk_prob=False.
    (3, True, 0),    # Qwen3-MoE with norm_topk_prob=True.
    (2, False, 12),  # Qwen2-MoE: raw gates and a shared expert of its own width.
])
def test_the_layer_equals_the_reference_router(k, norm_topk, shared_f):
  rng = np.random.default_rng(k * 10 + shared_f)
  block = ref.random_block(rng, D, F, E, shared_f)
  x = rng.normal(size=(2, 7, D)).astype(np.float32)
  layer = moe.MoeMlp(F, E, k, capacity_factor=None, renormalize=norm_topk, shared_d_ff=shared_f)
  got, stats = run_layer(layer, block, x)
  want = ref.sparse_moe(x, block, k, norm_topk)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
  assert float(stats['dropped']) == 0.0


def test_renormalizing_changes_the_output():
  """The reference tells the two router kinds apart on these weights (the test can fail)."""
  rng = np.random.default_rng(0)
  block = ref.random_block(rng, D, F, E)
  x = rng.normal(size=(1, 5, D)).astype(np.float32)
  got, _ = run_layer(moe.MoeMlp(F, E, 2, None, renormalize=False), block, x)
  other = ref.sparse_moe(x, block, 2, norm_topk=True)
  assert np.abs(got - other).max() > 1e-2 * np.abs(other).max()


def test_dropless_capacity_keeps_every_token_when_all_pick_one_expert():
  rng = np.random.default_rng(1)
  block = ref.random_block(rng, D, F, E)
  router = np.zeros((E, D))
  router[0, 0], router[1, 1] = 20.0, 1.0  # Feature 0 is large for every token: all pick 0 first.
  block = block._replace(router=router)
  x = rng.normal(size=(2, 9, D)).astype(np.float32)
  x[..., 0] = 3.0
  want = ref.sparse_moe(x, block, 2, norm_topk=True)
  got, stats = run_layer(moe.MoeMlp(F, E, 2, capacity_factor=None, renormalize=True), block, x)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
  assert float(stats['dropped']) == 0.0 and float(stats['max_load']) >= 0.5
  # A finite capacity drops on the same routing: the comparison above can see a drop.
  capped, stats = run_layer(moe.MoeMlp(F, E, 2, capacity_factor=1.0, renormalize=True), block, x)
  assert float(stats['dropped']) >= 4 / 18  # Expert 0 keeps 5 of each row's 9 first choices.
  assert np.abs(capped - want).max() > 1e-2 * np.abs(want).max()


def test_route_renormalize_overrides_the_k_rule():
  probs = jnp.asarray([[[0.5, 0.3, 0.2]]])
  route = jax.jit(moe.route, static_argnums=(1, 2), static_argnames=('renormalize',))
  gates = lambda k, renorm: np.asarray(route(probs, k, 1, renormalize=renorm).combine)[
      0, 0].sum(-1)
  np.testing.assert_allclose(gates(1, None), [0.5, 0, 0], rtol=1e-6)  # Switch's raw gate.
  np.testing.assert_allclose(gates(1, True), [1, 0, 0], rtol=1e-6)
  np.testing.assert_allclose(gates(2, None), [0.625, 0.375, 0], rtol=1e-6)
  np.testing.assert_allclose(gates(2, False), [0.5, 0.3, 0], rtol=1e-6)


TINY = dict(vocab_size=64, num_layers=4, d_model=32, num_heads=4, d_ff=48, max_len=16,
            num_experts=4, experts_per_token=2, capacity_factor=None, moe_every=2,
            moe_d_ff=16, moe_shared_d_ff=24, moe_renormalize=False)


def test_model_fields_size_the_experts_and_the_shared_expert():
  model = TransformerLM(**TINY)
  tokens = np.zeros((1, 12), np.int32)
  # The params' shapes (nothing computed): all the sizes and the FLOPs below need.
  params = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), tokens))['params']
  assert params['block_0']['mlp']['wi_gate']['kernel'].shape == (32, 48)  # Dense: d_ff.
  mlp = params['block_1']['mlp']
  assert mlp['wi_gate'].shape == (4, 32, 16) and mlp['wo'].shape == (4, 16, 32)
  assert mlp['shared_expert']['wi_up']['kernel'].shape == (32, 24)
  assert mlp['shared_gate'].shape == (32, 1)
  # FLOPs from the real tree: expert weights [E, ...] count k/E, everything else whole.
  flat = traverse_util.flatten_dict(params)
  expert = lambda path, x: 'mlp' in path and x.ndim == 3
  n = sum(x.size * (2 / 4 if expert(path, x) else 1) for path, x in flat.items() if x.ndim >= 2)
  want = 6 * n + 12 * 4 * 32 * 13 / 2
  assert lm_flops.flops_per_token(model, 12) == pytest.approx(want, rel=1e-12)


def test_scanned_model_with_a_shared_expert_equals_the_unrolled_one():
  model = TransformerLM(**TINY)
  tokens = np.random.default_rng(0).integers(0, 64, (2, 10)).astype(np.int32)
  params = nn.unbox(model.init(jax.random.key(1), tokens))['params']
  want = model.apply({'params': params}, tokens)
  got = jax.jit(model.clone(scan_layers=True).apply)({'params': stack_layers(params, 4, 2)},
                                                     tokens)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('fields, message', [
    (dict(moe_d_ff=0), 'moe_d_ff must be None'),
    (dict(moe_shared_d_ff=-1), 'moe_shared_d_ff must be 0'),
])
def test_bad_expert_widths_are_refused(fields, message):
  with pytest.raises(ValueError, match=message):
    jax.jit(TransformerLM(**{**TINY, **fields}).init)(jax.random.key(0),
                                                      jnp.ones((1, 4), jnp.int32))


LORA = dict(lora_rank=2, lora_alpha=4.0, lora_targets=('query', 'wi_gate', 'wi_up', 'wo'))


def test_lora_on_the_experts_adapts_each_expert_and_merges_into_its_kernel():
  """Every expert (and the shared expert) gets its own adapters: the model starts equal to its
  base (B = 0), and with B moved the merged plain model computes what the adapted one does,
  each expert's kernel W_e + (alpha / r) A_e B_e (numpy, per expert)."""
  model = TransformerLM(**{**TINY, **LORA})
  tokens = np.random.default_rng(0).integers(0, 64, (2, 10)).astype(np.int32)
  params = nn.unbox(model.init(jax.random.key(1), tokens))['params']
  mlp = params['block_1']['mlp']
  assert mlp['wi_gate_lora_a'].shape == (4, 32, 2) and mlp['wo_lora_b'].shape == (4, 2, 32)
  assert 'wi_up_lora_a' in mlp['shared_expert']
  base = lora.merge_lora(params, model)
  plain = model.clone(lora_rank=0)
  np.testing.assert_allclose(model.apply({'params': params}, tokens),
                             plain.apply({'params': base}, tokens), rtol=1e-6, atol=1e-6)
  moved = jax.tree_util.tree_map_with_path(  # In numpy float32: no compile per shape.
      lambda path, x: np.asarray(x) + np.float32(0.2) if 'lora_b' in jax.tree_util.keystr(path)
      else x, params)
  merged = lora.merge_lora(moved, model)
  got = plain.apply({'params': merged}, tokens)
  want = model.apply({'params': moved}, tokens)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert np.abs(np.asarray(want) - np.asarray(plain.apply({'params': base}, tokens))).max() > 1e-3
  m = jax.tree.map(np.asarray, moved['block_1']['mlp'])
  merged_wo = np.asarray(merged['block_1']['mlp']['wo'])
  for e in range(4):
    expect = m['wo'][e] + 2.0 * m['wo_lora_a'][e] @ m['wo_lora_b'][e]
    np.testing.assert_allclose(merged_wo[e], expect, rtol=1e-5, atol=1e-6)
  # Scanned: the same adapters stacked, the same logits.
  scanned = model.clone(scan_layers=True)
  np.testing.assert_allclose(jax.jit(scanned.apply)({'params': stack_layers(moved, 4, 2)},
                                                    tokens), want, rtol=1e-5, atol=1e-5)
