"""The MoE block against independent computations: the dense MLP, a slot-by-slot reference
router written as plain loops, and the auxiliary losses' formulas counted by hand."""

import flax.linen as nn
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType

from paxlike.families import lm_flops
from paxlike.layers import TransformerLM, moe, stack_layers, unstack_layers
from paxlike.layers.blocks import Mlp

D, F = 8, 16


def _reference_route(probs: np.ndarray, k: int, slots: int):
  """Slots by plain loops: every row's first choices in token order, then its second, ...;
  returns {(b, t, e): slot} and the dropped count."""
  placed, dropped = {}, 0
  for b in range(probs.shape[0]):
    order = np.argsort(-probs[b], axis=-1, kind='stable')[:, :k]
    filled = [0] * probs.shape[-1]
    for j in range(k):
      for t in range(probs.shape[1]):
        e = int(order[t, j])
        if filled[e] < slots:
          placed[b, t, e] = filled[e]
          filled[e] += 1
        else:
          dropped += 1
  return placed, dropped


_route = jax.jit(moe.route, static_argnums=(1, 2))
_load_balance_loss = jax.jit(moe.load_balance_loss)  # One program per shape, not one per op.


def _hand_probs() -> np.ndarray:
  """One row of 6 tokens over 3 experts: first choices 0,0,0,1,0,2 and second 1,2,1,0,1,0."""
  return np.array([[[.6, .3, .1], [.5, .1, .4], [.7, .2, .1],
                    [.3, .6, .1], [.5, .4, .1], [.3, .1, .6]]], np.float32)


def test_capacity():
  assert moe.capacity(16, 4, 2, 1.0) == 8
  assert moe.capacity(10, 4, 1, 1.25) == 4  # ceil(3.125)
  assert moe.capacity(16, 4, 2, None) == moe.capacity(16, 4, 2, 0) == 16
  assert moe.capacity(4, 2, 2, 8.0) == 4  # Never more slots than tokens.
  assert moe.capacity(1, 8, 2, 1.25) == 1


def test_dropped_count_is_exact_on_a_hand_built_routing():
  probs = _hand_probs()
  # k=1, 2 slots: expert 0 is picked by tokens 0, 1, 2, 4 and keeps 0 and 1; 2 and 4 drop.
  routing = _route(jnp.asarray(probs), 1, 2)
  assert int(routing.dropped) == 2
  assert np.asarray(routing.dispatch).sum(axis=(2, 3)).tolist() == [[1, 1, 0, 1, 0, 1]]
  # k=2, 2 slots: expert 0 gets 0, 1 (first choices; 2, 4 and token 3's and 5's second choices
  # drop); expert 1 gets 3 (first), then 0 (second; 2 and 4 drop); expert 2 gets 5, then 1.
  routing = _route(jnp.asarray(probs), 2, 2)
  assert int(routing.dropped) == 6
  want, dropped = _reference_route(probs, 2, 2)
  assert dropped == 6
  assert sorted(want) == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 2), (0, 3, 1), (0, 5, 2)]


@pytest.mark.parametrize('k, slots', [(1, 3), (2, 3), (2, 5), (3, 2)])
def test_route_matches_the_loop_reference(k, slots):
  probs = np.asarray(jax.jit(jax.nn.softmax)(
      jax.random.normal(jax.random.key(k * 7 + slots), (3, 9, 4))))
  routing = _route(jnp.asarray(probs), k, slots)
  placed, dropped = _reference_route(probs, k, slots)
  want = np.zeros(routing.dispatch.shape, np.float32)
  for (b, t, e), c in placed.items():
    want[b, t, e, c] = 1
  np.testing.assert_array_equal(routing.dispatch, want)
  assert int(routing.dropped) == dropped
  # combine = dispatch × the chosen gate, renormalised over the k choices when k > 1.
  top = np.sort(probs, axis=-1)[..., ::-1][..., :k]
  norm = top.sum(-1, keepdims=True) if k > 1 else np.ones_like(top[..., :1])
  gate = np.where(probs >= top[..., -1:], probs / norm, 0.0)
  np.testing.assert_allclose(routing.combine, want * gate[..., None], rtol=1e-6)


def test_load_balance_loss_equals_its_formula_on_a_hand_built_routing():
  probs = _hand_probs()
  # k=1: expert shares f = (4, 1, 1)/6; mean probs P = (2.9, 1.7, 1.4)/6.
  want = 3 * (4 * 2.9 + 1 * 1.7 + 1 * 1.4) / 36
  choices = _route(jnp.asarray(probs), 1, 6).choices
  np.testing.assert_allclose(_load_balance_loss(probs, choices), want, rtol=1e-6)
  # k=2: choices per expert (first + second) = (4+2, 1+3, 1+1) over 12.
  want = 3 * (6 * 2.9 + 4 * 1.7 + 2 * 1.4) / 72
  choices = _route(jnp.asarray(probs), 2, 6).choices
  np.testing.assert_allclose(_load_balance_loss(probs, choices), want, rtol=1e-6)
  uniform = np.full((1, 4, 2), 0.5, np.float32)
  assert float(_load_balance_loss(uniform, np.array([[[0], [1], [0], [1]]]))) == 1.0


def _layer(num_experts: int, k: int, capacity_factor=1.0, **kw) -> moe.MoeMlp:
  return moe.MoeMlp(F, num_experts, k, capacity_factor, **kw)


def test_one_expert_top1_equals_the_dense_mlp():
  x = jax.random.normal(jax.random.key(0), (2, 5, D))
  for gated in (True, False):
    dense = Mlp(F, gated=gated)
    params = nn.unbox(jax.jit(dense.init)(jax.random.key(1), x))['params']
    experts = {name: p['kernel'][None] for name, p in params.items()}
    layer = _layer(1, 1, capacity_factor=1.0, gated=gated, activation='silu')
    router = jax.random.normal(jax.random.key(2), (D, 1))
    apply = jax.jit(layer.apply, static_argnames=('mutable',))
    y, stats = apply({'params': {'router': router, **experts}}, x, mutable=(moe.COLLECTION,))
    np.testing.assert_allclose(y, jax.jit(dense.apply)({'params': params}, x), rtol=1e-6,
                               atol=1e-6)
    assert float(moe.summarize(stats[moe.COLLECTION])['dropped']) == 0.0


def _hand_routed_layer(num_experts: int, k: int, capacity_factor: float):
  """A layer whose router logits are rows of `logits`, picked by one-hot inputs."""
  # [6 tokens, 3 experts]: softmax gives _hand_probs; the shifts move logsumexp (the z-loss).
  logits = np.log(_hand_probs()[0]) + 0.3 * np.arange(6)[:, None]
  x = jnp.eye(6, D)[None]  # Token t is the unit vector e_t, so its logits are row t.
  layer = _layer(num_experts, k, capacity_factor)
  params = nn.unbox(jax.jit(layer.init)(jax.random.key(0), x))['params']
  params['router'] = jnp.zeros((D, num_experts)).at[:6].set(logits)
  out, stats = jax.jit(layer.apply, static_argnames=('mutable',))(
      {'params': params}, x, mutable=(moe.COLLECTION,))
  return params, x, out, moe.summarize(stats[moe.COLLECTION]), logits


def test_the_layer_sows_exact_statistics():
  # 6 tokens, 3 experts, k=2, capacity ceil(0.5 · 2 · 6 / 3) = 2: the hand case above.
  _, _, _, stats, logits = _hand_routed_layer(3, 2, 0.5)
  np.testing.assert_allclose(stats['dropped'], 6 / 12, rtol=1e-6)
  np.testing.assert_allclose(stats['max_load'], 6 / 12, rtol=1e-6)
  balance = 3 * (6 * 2.9 + 4 * 1.7 + 2 * 1.4) / 72
  np.testing.assert_allclose(stats['aux_loss'], balance, rtol=1e-5)
  lse = np.log(np.exp(logits).sum(-1))
  np.testing.assert_allclose(stats['z_loss'], np.mean(lse**2), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(stats['loss'], 0.01 * balance + 1e-3 * np.mean(lse**2), rtol=1e-5)


def test_dropped_tokens_pass_nothing_through_the_experts():
  _, _, out, stats, _ = _hand_routed_layer(3, 1, 1.0)  # 2 slots, k=1: tokens 2, 4 drop.
  norms = np.linalg.norm(np.asarray(out[0]), axis=-1)
  assert (norms[[2, 4]] == 0).all() and (norms[[0, 1, 3, 5]] > 0).all()
  np.testing.assert_allclose(stats['dropped'], 2 / 6, rtol=1e-6)


@pytest.mark.parametrize('k', [1, 2])
def test_gradients_reach_the_router(k):
  x = jax.random.normal(jax.random.key(0), (2, 8, D))
  layer = _layer(4, k, capacity_factor=1.0, aux_loss_weight=0.0, router_z_loss_weight=0.0)
  params = nn.unbox(jax.jit(layer.init)(jax.random.key(1), x))['params']
  target = jax.random.normal(jax.random.key(2), x.shape)

  def loss(p):
    y, stats = layer.apply({'params': p}, x, mutable=[moe.COLLECTION])
    return jnp.mean((y - target) ** 2) + moe.summarize(stats[moe.COLLECTION])['loss']
  grads = jax.jit(jax.grad(loss))(params)
  assert float(jnp.abs(grads['router']).max()) > 1e-6  # Through the gates alone (no aux loss).
  assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))
  aux = lambda p: moe.summarize(layer.apply({'params': p}, x, mutable=[moe.COLLECTION])[1][
      moe.COLLECTION])['aux_loss']
  assert float(jnp.abs(jax.jit(jax.grad(aux))(params)['router']).max()) > 1e-6


def test_summarize_reduces_over_layers():
  stats = {'block_1': {'mlp': {'dropped': (jnp.float32(0.2),), 'max_load': (jnp.float32(.5),)}},
           'blocks': {'mlp': {'dropped': (jnp.asarray([0.1, 0.3]),),
                              'max_load': (jnp.asarray([.4, .7]),)}}}
  out = moe.summarize(stats)
  np.testing.assert_allclose(out['dropped'], 0.2, rtol=1e-6)
  np.testing.assert_allclose(out['max_load'], 0.7, rtol=1e-6)
  assert moe.summarize({}) == {}


def test_no_statistics_at_init():
  x = jnp.ones((1, 4, D))
  assert set(jax.eval_shape(_layer(2, 1).init, jax.random.key(0), x)) == {'params'}


def test_bad_expert_configs_are_refused():
  x = jnp.ones((1, 4, D))
  with pytest.raises(ValueError, match='experts_per_token=3 must be between 1 and num_experts=2'):
    _layer(2, 3).init(jax.random.key(0), x)
  mesh = AbstractMesh((3,), ('expert',), axis_types=(AxisType.Auto,))
  with jax.sharding.use_abstract_mesh(mesh):
    with pytest.raises(ValueError, match="mesh axis 'expert' of size 3 does not divide num_"):
      jax.eval_shape(_layer(4, 1).init, jax.random.key(0), x)


TINY_LM = dict(vocab_size=64, num_layers=4, d_model=32, num_heads=4, d_ff=32, max_len=16,
               num_experts=4, experts_per_token=2, capacity_factor=1.0)


@pytest.mark.parametrize('every, remat', [(1, 'none'), (2, 'dots'), (4, 'full')])
def test_scanned_moe_model_equals_the_unrolled_one(every, remat):
  tokens = np.random.default_rng(0).integers(0, 64, (2, 12)).astype(np.int32)
  model = TransformerLM(**TINY_LM, moe_every=every)
  params = nn.unbox(model.init(jax.random.key(1), tokens))['params']
  assert [i for i in range(4) if 'router' in params[f'block_{i}']['mlp']] == list(
      range(every - 1, 4, every))
  scanned = model.clone(scan_layers=True, remat_policy=remat)
  stacked = stack_layers(params, 4, every)
  shapes = jax.tree.map(jnp.shape,  # The scanned init's shapes (nothing computed).
                        nn.unbox(jax.eval_shape(scanned.init, jax.random.key(1), tokens))['params'])
  assert shapes == jax.tree.map(jnp.shape, stacked)
  assert jax.tree.all(jax.tree.map(np.array_equal, unstack_layers(stacked), params))

  def run(m, p):
    logits, stats = m.apply({'params': p}, tokens, mutable=[moe.COLLECTION])
    return logits, moe.summarize(stats[moe.COLLECTION])
  (want, want_stats), (got, got_stats) = run(model, params), run(scanned, stacked)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert set(got_stats) == {'loss', 'aux_loss', 'z_loss', 'dropped', 'max_load'}
  for name, value in want_stats.items():
    np.testing.assert_allclose(got_stats[name], value, rtol=1e-5)


@pytest.mark.parametrize('fields, message', [
    (dict(experts_per_token=5), 'experts_per_token=5 must be between 1 and num_experts=4'),
    (dict(moe_every=3, scan_layers=True), 'num_layers=4 must be a multiple of it'),
    (dict(moe_every=0), 'moe_every=0 must be between 1 and num_layers=4'),
    (dict(capacity_factor=-1.0), 'capacity_factor must be None, 0'),
    (dict(lora_rank=40, lora_targets=('wo',)), 'lora_rank=40 is larger than the expert wo'),
])
def test_bad_moe_model_fields_are_refused(fields, message):
  with pytest.raises(ValueError, match=message):
    jax.jit(TransformerLM(**{**TINY_LM, **fields}).init)(jax.random.key(0),
                                                         jnp.ones((1, 4), jnp.int32))


def test_flops_count_only_the_active_experts():
  """N from the real param tree: every matrix, with each expert weight [E, ...] counted k/E
  times (a token runs k of the E experts); the router counts whole."""
  model = TransformerLM(**{**TINY_LM, 'moe_every': 2})
  seq = 12
  params = nn.unbox(jax.eval_shape(model.init, jax.random.key(0),  # Shapes: nothing computed.
                                   np.zeros((1, seq), np.int32)))['params']
  flat = traverse_util.flatten_dict(params)
  expert = lambda path, x: 'mlp' in path and x.ndim == 3
  n = sum(x.size * (2 / 4 if expert(path, x) else 1) for path, x in flat.items() if x.ndim >= 2)
  want = 6 * n + 12 * 4 * 32 * (seq + 1) / 2
  assert lm_flops.flops_per_token(model, seq) == pytest.approx(want, rel=1e-12)
  dense = lm_flops.flops_per_token(model.clone(num_experts=0), seq)
  # k=1 is the dense MLP plus the router; k=2 doubles the MLP.
  assert dense < lm_flops.flops_per_token(model.clone(experts_per_token=1), seq) < want
