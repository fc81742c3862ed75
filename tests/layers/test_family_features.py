"""The model-family features as TransformerLM fields trained from scratch: scanned equals
unrolled (local/global layers as scanned flags), LoRA trains, and the FLOP estimate counts
the explicit head_dim and the local layers' windows."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict

from paxlike.families import lm_flops
from paxlike.families.shapes import abstract_params
from paxlike.layers import TransformerLM
from paxlike.layers.rope import RopeScaling
from paxlike.layers.stacking import stack_layers

EVERYTHING = dict(vocab_size=61, num_layers=4, d_model=32, num_heads=4, num_kv_heads=2,
                  head_dim=12, d_ff=40, qkv_bias=True, out_bias=True, qk_norm=True,
                  rope_scaling=RopeScaling('linear', 4.0), local_rope_base=100.0,
                  sliding_window=3, global_every=2, norm_weight_offset=1.0, sandwich_norm=True,
                  scale_embeddings=True, query_scale=0.3, attn_logit_softcap=4.0,
                  final_logit_softcap=5.0, mlp_activation='gelu_tanh', attention_impl='xla')
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 61, (2, 11)))


def perturbed(params):
  """Params moved off their init (biases and Gemma's norm weights start at zero)."""
  rng = np.random.default_rng(1)
  return jax.tree.map(lambda x: np.asarray(x) + 0.2 * rng.standard_normal(x.shape), params)


def test_scanned_equals_unrolled_with_every_feature():
  model = TransformerLM(**EVERYTHING)
  params = perturbed(nn.unbox(model.init(jax.random.key(0), TOKENS))['params'])
  unrolled = model.apply({'params': params}, TOKENS)
  for remat in ('none', 'full'):
    scanned = model.clone(scan_layers=True, remat_policy=remat)
    np.testing.assert_allclose(
        scanned.apply({'params': stack_layers(params, 4)}, TOKENS), unrolled, atol=2e-5)
  # The local/global pattern matters: all-local layers give other logits.
  alike = model.clone(global_every=0)
  assert not np.allclose(alike.apply({'params': params}, TOKENS), unrolled, atol=1e-3)


def test_lora_trains_the_adapters_of_a_featured_model():
  model = TransformerLM(**EVERYTHING, lora_rank=2, lora_targets=('query', 'value', 'wi_up'),
                        scan_layers=True)
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), TOKENS))['params']
  params = jax.tree_util.tree_map_with_path(
      lambda p, x: x + 0.1 if str(p[-1]).endswith("lora_b']") else x, params)
  loss = lambda p: jnp.mean(model.apply({'params': p}, TOKENS) ** 2)
  grads = flatten_dict(jax.jit(jax.grad(loss))(params))
  adapters = [g for k, g in grads.items() if k[-1].endswith('_lora_a')]
  assert adapters and all(np.isfinite(g).all() and np.abs(g).max() > 0 for g in adapters)


def test_flops_count_head_dim_biases_aside_and_local_windows():
  model = TransformerLM(**EVERYTHING)
  kernels = {k: v for k, v in flatten_dict(abstract_params(model, seq_len=8)).items()
             if k[-1] in ('query', 'key', 'value', 'out', 'kernel')}
  head = 61 * 32  # Tied: the embedding is the output projection.
  assert lm_flops.matmul_params(model) == sum(v.size for v in kernels.values()) + head
  # Layers 0 and 2 are local (window 3), 1 and 3 global; T = 8.
  local, full = (3 * 4 // 2 + 5 * 3) / 8, 9 / 2
  assert lm_flops.mean_attended_keys(model, 8) == (local + full) / 2
  assert lm_flops.flops_per_token(model, 8) == (6 * lm_flops.matmul_params(model)
                                                + 12 * 4 * 4 * 12 * (local + full) / 2)
