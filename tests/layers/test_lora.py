"""LoRA adapters: rank 0 is today's model; at init (B = 0) the base logits; merging folds
(alpha / r) * A @ B into each kernel (checked in numpy) and gives the adapter model's logits;
lora_mask marks exactly the adapters."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from paxlike.layers import TransformerLM, lora, stack_layers

TINY = dict(vocab_size=64, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, d_ff=48,
            max_len=32)
TOKENS = np.random.default_rng(0).integers(0, 64, (2, 12)).astype(np.int32)
ALL_GATED = ('query', 'key', 'value', 'out', 'wi_gate', 'wi_up', 'wo')
# One rank for every adapter model: their eager ops' shapes, so their compiled programs, repeat.
RANK = 3


def _params(model):
  return nn.unbox(model.init(jax.random.key(0), TOKENS))['params']


def _with_random_b(params, seed: int = 1):
  """Adapters' B set to random float32 values (at init they are zeros), drawn by numpy
  (jax.random compiles a program per shape)."""
  rng = np.random.default_rng(seed)
  def fill(path, x):
    if not str(path[-1].key).endswith('_lora_b'):
      return x
    return (rng.standard_normal(x.shape) * 0.05).astype(np.float32)
  return jax.tree_util.tree_map_with_path(fill, params)


def _base(params):
  """`params` without the adapter leaves."""
  if not isinstance(params, dict):
    return params
  return {k: _base(v) for k, v in params.items() if not k.endswith(('_lora_a', '_lora_b'))}


def test_rank_zero_is_todays_model():
  plain = TransformerLM(**TINY)
  off = TransformerLM(**TINY, lora_rank=0, lora_targets=ALL_GATED)
  params = _params(plain)
  assert jax.tree.structure(_params(off)) == jax.tree.structure(params)
  np.testing.assert_array_equal(off.apply({'params': params}, TOKENS),
                                plain.apply({'params': params}, TOKENS))


def test_adapter_params_their_names_and_the_init_equals_the_base_model():
  model = TransformerLM(**TINY, lora_rank=RANK, lora_targets=ALL_GATED)
  boxed = model.init(jax.random.key(0), TOKENS)['params']['block_0']
  attn, mlp = boxed['attention'], boxed['mlp']
  assert attn['query_lora_a'].names == ('embed', 'lora_rank')
  assert attn['query_lora_a'].value.shape == (32, 3)
  assert attn['key_lora_b'].names == ('lora_rank', 'kv_heads', 'kv')
  assert attn['key_lora_b'].value.shape == (3, 2, 8)
  assert attn['out_lora_a'].names == ('heads', 'kv', 'lora_rank')
  assert attn['out_lora_b'].names == ('lora_rank', 'embed')
  assert mlp['wo_lora_a'].names == ('mlp', 'lora_rank') and mlp['wo_lora_a'].value.shape == (48, 3)
  assert not np.any(np.asarray(mlp['wi_up_lora_b'].value))
  params, base = _params(model), _params(TransformerLM(**TINY))
  # The base kernels initialise as without adapters, and B = 0 leaves the logits alone.
  assert jax.tree.all(jax.tree.map(np.array_equal, _base(params), base))
  np.testing.assert_allclose(model.apply({'params': params}, TOKENS),
                             TransformerLM(**TINY).apply({'params': base}, TOKENS), atol=1e-6)


@pytest.mark.parametrize('fields', [
    dict(lora_targets=('query', 'value')),
    dict(lora_targets=ALL_GATED, lora_alpha=8.0),
    dict(lora_targets=('key', 'out', 'wi', 'wo'), gated_mlp=False),
    dict(lora_targets=ALL_GATED, scan_layers=True),
])
def test_merged_params_give_the_adapter_models_logits(fields):
  model = TransformerLM(**TINY, lora_rank=RANK, **fields)
  unrolled = model.clone(scan_layers=False)
  params = _with_random_b(_params(unrolled))
  params = stack_layers(params, 2) if model.scan_layers else params
  adapted = model.apply({'params': params}, TOKENS)
  merged = lora.merge_lora(params, model)
  assert jax.tree.structure(merged) == jax.tree.structure(_base(params))
  plain = model.clone(lora_rank=0)
  np.testing.assert_allclose(plain.apply({'params': merged}, TOKENS), adapted, atol=1e-5,
                             rtol=1e-5)
  assert not np.allclose(plain.apply({'params': _base(params)}, TOKENS), adapted, atol=1e-3)


def test_merge_is_base_plus_scaled_a_times_b_in_numpy():
  model = TransformerLM(**TINY, lora_rank=RANK, lora_alpha=9.0, lora_targets=ALL_GATED)
  params = _with_random_b(_params(model))
  merged = lora.merge_lora(params, model)
  for path, (base, get) in {
      'query': ((32, 4, 8), lambda t: t['attention']['query']),
      'out': ((4, 8, 32), lambda t: t['attention']['out']),
      'wi_gate': ((32, 48), lambda t: t['mlp']['wi_gate']['kernel']),
      'wo': ((48, 32), lambda t: t['mlp']['wo']['kernel'])}.items():
    block = params['block_1']
    owner = block['attention'] if path in lora.ATTENTION_TARGETS else block['mlp']
    a = np.asarray(owner[f'{path}_lora_a'], np.float64)
    b = np.asarray(owner[f'{path}_lora_b'], np.float64)
    w = np.asarray(get(block), np.float64)
    assert w.shape == base
    want = w + 3.0 * (a.reshape(-1, RANK) @ b.reshape(RANK, -1)).reshape(w.shape)
    np.testing.assert_allclose(np.asarray(get(merged['block_1'])), want, rtol=1e-5, atol=1e-6)


def test_lora_mask_marks_exactly_the_adapters_boxed_or_not():
  model = TransformerLM(**TINY, lora_rank=RANK, lora_targets=('value', 'wo'))
  boxed = model.init(jax.random.key(0), TOKENS)['params']
  for tree in (boxed, nn.unbox(boxed)):
    flat = jax.tree.flatten_with_path(lora.lora_mask(tree))[0]
    marked = {'/'.join(str(k.key) for k in path if hasattr(k, 'key')) for path, on in flat if on}
    assert marked == {f'block_{i}/{m}/{n}{s}' for i in range(2)
                      for m, n in (('attention', 'value'), ('mlp', 'wo'))
                      for s in ('_lora_a', '_lora_b')}


def test_targets_that_name_no_kernel_are_config_errors():
  with pytest.raises(ValueError, match=r"lora_targets \('wi',\) name no kernel"):
    TransformerLM(**TINY, lora_rank=2, lora_targets=('wi',)).init(jax.random.key(0), TOKENS)
  with pytest.raises(ValueError, match='lora_rank must be >= 0'):
    TransformerLM(**TINY, lora_rank=-1).init(jax.random.key(0), TOKENS)
