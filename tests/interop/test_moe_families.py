"""Mixtral, Qwen2-MoE and Qwen3-MoE checkpoints the tests write (safetensors + config.json, both
config layouts, per-expert and fused experts): imported logits equal the float64 numpy reference
of tests/interop/moe_reference.py with no token dropped, the KV-cache decoder equals a full
recompute, export -> reimport is bitwise, the model trains on an 8-device expert mesh as on one
device, and what is not honoured is refused by name."""

import json
import re

import fiddle as fdl
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import NamedSharding, PartitionSpec as P
from safetensors.numpy import save_file

from paxlike.decode import generate
from paxlike.errors import UserError
from paxlike.interop import checkpoint
from paxlike.interop.architectures import architecture_for_model
from paxlike.layers import lora, moe
from paxlike.trainer import init_from
from tests.decode.test_generate import recompute_greedy
from tests.helpers import run_script
from tests.interop import moe_reference as ref

BASE = dict(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
            tie_word_embeddings=False, hidden_act='silu', num_experts_per_tok=2,
            output_router_logits=False, router_aux_loss_coef=0.001, attention_dropout=0.0)
QWEN = dict(intermediate_size=40, moe_intermediate_size=24, num_experts=4, decoder_sparse_step=1,
            mlp_only_layers=[], use_sliding_window=False, sliding_window=None,
            max_window_layers=2)
CONFIGS = {
    'mixtral': {**BASE, 'model_type': 'mixtral', 'architectures': ['MixtralForCausalLM'],
                'intermediate_size': 24, 'num_local_experts': 4, 'sliding_window': None,
                'router_jitter_noise': 0.0},
    'qwen3_moe': {**BASE, **QWEN, 'model_type': 'qwen3_moe', 'head_dim': 16,
                  'norm_topk_prob': True, 'attention_bias': False},
    'qwen2_moe': {**BASE, **QWEN, 'model_type': 'qwen2_moe', 'norm_topk_prob': False,
                  'qkv_bias': True, 'shared_expert_intermediate_size': 36,
                  'layer_types': ['full_attention'] * 2},
    # A window of 5 tokens, beyond which the 12 positions of TOKENS reach.
    'mixtral_window': {**BASE, 'model_type': 'mixtral', 'intermediate_size': 24,
                       'num_local_experts': 4, 'sliding_window': 5, 'router_jitter_noise': 0.0},
    # Layer 0 dense (intermediate_size), layer 1 MoE; 3 of 4 experts per token, raw weights.
    'qwen3_moe_step2': {**BASE, **QWEN, 'model_type': 'qwen3_moe', 'decoder_sparse_step': 2,
                        'num_experts_per_tok': 3, 'norm_topk_prob': False,
                        'attention_bias': True},
}
THETA = 1e6
TOKENS = np.random.default_rng(1).integers(0, 61, (2, 12))


def hf_config(name: str, layout: str) -> dict:
  """CONFIGS[name] with its RoPE in transformers 4's ('v4') or 5's ('v5') layout."""
  rope = ({'rope_theta': THETA} if layout == 'v4' else
          {'rope_parameters': {'rope_type': 'default', 'rope_theta': THETA}})
  return {**CONFIGS[name], **rope}


def write(directory, tensors: dict, cfg: dict):
  directory.mkdir(parents=True, exist_ok=True)
  save_file(tensors, str(directory / 'model.safetensors'))
  (directory / 'config.json').write_text(json.dumps(cfg))
  return directory


def logits_and_dropped(cfg: fdl.Config, params) -> tuple[np.ndarray, float]:
  model = fdl.build(cfg)
  logits, sown = model.apply({'params': params}, jnp.asarray(TOKENS), mutable=[moe.COLLECTION])
  return np.asarray(logits), float(moe.summarize(sown[moe.COLLECTION])['dropped'])


def max_relative_error(got: np.ndarray, want: np.ndarray) -> float:
  return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.mark.parametrize('layout, fused', [('v4', False), ('v5', True)])
@pytest.mark.parametrize('name', CONFIGS)
def test_imported_logits_equal_the_reference_with_nothing_dropped(tmp_path, name, layout, fused):
  cfg = hf_config(name, layout)
  tensors = ref.random_checkpoint(cfg)
  write(tmp_path, ref.fused_checkpoint(tensors, cfg) if fused else tensors, cfg)
  want = ref.moe_logits(tensors, cfg, TOKENS)
  model_cfg, params = checkpoint.load_hf_checkpoint(tmp_path)
  got, dropped = logits_and_dropped(model_cfg, params)
  assert max_relative_error(got, want) < 1e-4 and dropped == 0.0
  # Scanned layers: the same checkpoint stacked under 'blocks', the same logits.
  scan_cfg, scan_params = checkpoint.load_hf_checkpoint(tmp_path, scan_layers=True)
  assert max_relative_error(logits_and_dropped(scan_cfg, scan_params)[0], want) < 1e-4
  # Export writes the per-expert layout, bitwise the original (from either layout read).
  exported = checkpoint.export_params(params, fdl.build(model_cfg))
  assert exported.keys() == tensors.keys()
  assert all(exported[k].tobytes() == v.tobytes() for k, v in tensors.items())


def test_the_reference_sees_the_router_kind_and_the_shared_expert():
  """The reference is not blind to what the tests check: renormalising or not, and the shared
  expert, each change its logits."""
  cfg = hf_config('qwen2_moe', 'v4')
  tensors = ref.random_checkpoint(cfg)
  want = ref.moe_logits(tensors, cfg, TOKENS)
  assert max_relative_error(ref.moe_logits(tensors, {**cfg, 'norm_topk_prob': True}, TOKENS),
                            want) > 1e-2
  no_shared = {k: v for k, v in tensors.items() if 'shared_expert' not in k}
  assert max_relative_error(ref.moe_logits(no_shared, cfg, TOKENS), want) > 1e-2


@pytest.mark.parametrize('name', ['mixtral', 'qwen2_moe', 'qwen3_moe_step2'])
def test_save_and_reload_round_trip(tmp_path, name):
  cfg = hf_config(name, 'v5')
  tensors = ref.random_checkpoint(cfg, seed=3)
  model_cfg, params = checkpoint.load_hf_checkpoint(write(tmp_path / 'in', tensors, cfg))
  model = fdl.build(model_cfg)
  checkpoint.save_hf_checkpoint(params, model, tmp_path / 'out')
  saved = json.loads((tmp_path / 'out' / 'config.json').read_text())
  assert saved['model_type'] == cfg['model_type']
  assert saved['architectures'] == [architecture_for_model(model).hf_class]
  for key in ('num_experts_per_tok', 'moe_intermediate_size', 'decoder_sparse_step',
              'norm_topk_prob', 'shared_expert_intermediate_size', 'num_local_experts',
              'head_dim', 'intermediate_size', 'qkv_bias', 'attention_bias'):
    assert saved.get(key) == cfg.get(key, saved.get(key)), key
  again_cfg, again = checkpoint.load_hf_checkpoint(tmp_path / 'out')
  assert again_cfg == model_cfg
  assert jax.tree.all(jax.tree.map(np.array_equal, again, params))


@pytest.mark.parametrize('name, scan, fused', [('mixtral', False, False),
                                               ('qwen3_moe_step2', True, True)])
def test_the_streamed_import_of_init_from_places_the_same_params(tmp_path, name, scan, fused):
  """train.init_from='hf:DIR' reads one tensor at a time: the per-expert rows are stacked, a
  fused checkpoint split, and a scanned model with dense and MoE layers grouped as it runs."""
  cfg = hf_config(name, 'v5')
  tensors = ref.random_checkpoint(cfg)
  write(tmp_path, ref.fused_checkpoint(tensors, cfg) if fused else tensors, cfg)
  model_cfg, params = checkpoint.load_hf_checkpoint(tmp_path, scan_layers=scan)
  replicated = NamedSharding(jax.make_mesh((1,), ('data',)), P())
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                          params)
  placed = init_from.load_params(f'hf:{tmp_path}', abstract, fdl.build(model_cfg))
  want = traverse_util.flatten_dict(params, sep='/')
  assert sorted(placed) == sorted(want)
  assert all(np.asarray(placed[k]).tobytes() == v.tobytes() for k, v in want.items())


def test_a_lora_fine_tune_exports_merged_and_reimports_to_its_logits(tmp_path):
  """Adapters on the attention of an imported Mixtral (LoRA stays off the experts): merged on
  export, the reimported checkpoint computes what the adapted model does."""
  cfg = hf_config('mixtral', 'v5')
  model_cfg, base = checkpoint.load_hf_checkpoint(write(tmp_path, ref.random_checkpoint(cfg), cfg))
  model = fdl.build(model_cfg).clone(lora_rank=2, lora_targets=('query', 'value'))
  fresh = traverse_util.flatten_dict(nn.unbox(model.init(jax.random.key(0), jnp.asarray(TOKENS)))
                                     ['params'])
  weights = traverse_util.flatten_dict(base)
  # The checkpoint's weights; adapters of the init with B moved off zero (a trained adapter).
  params = traverse_util.unflatten_dict({
      path: weights[path] if path in weights else x + 0.3 * ('lora_b' in path[-1])
      for path, x in fresh.items()})
  want = np.asarray(model.apply({'params': params}, jnp.asarray(TOKENS)))
  merged = lora.merge_lora(params, model)
  checkpoint.save_hf_checkpoint(merged, model.clone(lora_rank=0), tmp_path / 'out')
  again_cfg, again = checkpoint.load_hf_checkpoint(tmp_path / 'out')
  got = np.asarray(fdl.build(again_cfg).apply({'params': again}, jnp.asarray(TOKENS)))
  base_logits = logits_and_dropped(model_cfg, base)[0]
  assert max_relative_error(got, want) < 1e-5 and max_relative_error(base_logits, want) > 1e-3


@pytest.mark.parametrize('name', ['mixtral', 'qwen2_moe', 'qwen3_moe'])
def test_greedy_kv_cache_decode_equals_full_recompute(tmp_path, name):
  cfg = hf_config(name, 'v4')
  tensors = {k: 3 * v if 'embed' in k or 'lm_head' in k else v
             for k, v in ref.random_checkpoint(cfg, seed=5).items()}  # Confident choices.
  model_cfg, params = checkpoint.load_hf_checkpoint(write(tmp_path, tensors, cfg))
  model = fdl.build(model_cfg)
  prompt = np.asarray([5, 17, 3, 44, 9], np.int32)
  got = generate(model, params, [prompt], max_new_tokens=10)[0]
  np.testing.assert_array_equal(got, recompute_greedy(model, params, prompt, 10))


@pytest.mark.parametrize('name, changes, message', [
    ('mixtral', {'router_jitter_noise': 0.1}, 'router_jitter_noise=0.1'),
    ('mixtral', {'num_experts_per_tok': 5}, 'num_experts_per_tok=5 exceeds num_local_experts=4'),
    ('mixtral', {'router_z_loss_coef': 0.1}, 'router_z_loss_coef=0.1'),
    ('qwen3_moe', {'mlp_only_layers': [0]}, 'mlp_only_layers=[0]'),
    ('qwen3_moe', {'use_sliding_window': True}, 'use_sliding_window=True'),
    ('qwen3_moe', {'decoder_sparse_step': 3}, 'decoder_sparse_step=3 leaves no MoE layer'),
    ('qwen3_moe', {'hidden_act': 'relu'}, "hidden_act='relu'"),
    ('qwen2_moe', {'shared_expert_intermediate_size': 0}, 'shared_expert_intermediate_size=0'),
    ('qwen2_moe', {'layer_types': ['sliding_attention', 'full_attention']}, 'sliding_attention'),
    ('qwen2_moe', {'num_experts': None}, 'num_experts=None'),
    ('qwen2_moe', {'head_dim': 16}, 'head_dim=16 is not supported'),
])
def test_what_is_not_honoured_is_refused_by_name(name, changes, message):
  with pytest.raises(UserError, match=re.escape(message)):
    checkpoint.config_from_hf({**hf_config(name, 'v4'), **changes})


@pytest.mark.parametrize('model_type', ['deepseek_v3', 'dbrx', 'jamba', 'gpt2'])
def test_other_moe_architectures_are_refused_naming_the_supported(model_type):
  cfg = {**hf_config('mixtral', 'v4'), 'model_type': model_type}
  with pytest.raises(UserError, match=f"model_type='{model_type}' is not supported.*mixtral"):
    checkpoint.config_from_hf(cfg)


def test_a_model_is_written_as_the_moe_family_it_matches():
  build = lambda name, **kw: fdl.build(checkpoint.config_from_hf(hf_config(name, 'v4'), **kw))
  assert architecture_for_model(build('mixtral')).model_type == 'mixtral'
  assert architecture_for_model(build('qwen2_moe')).model_type == 'qwen2_moe'
  assert architecture_for_model(build('qwen3_moe_step2')).model_type == 'qwen3_moe'
  # Raw top-2 weights are not Mixtral's router; without q/k norm not Qwen3-MoE's: no family.
  with pytest.raises(UserError, match='mixtral: moe_renormalize=False'):
    architecture_for_model(build('mixtral', moe_renormalize=False))
  with pytest.raises(UserError, match='cannot be written as mixtral.*moe_shared_d_ff=36'):
    checkpoint.config_to_hf(build('qwen2_moe'), 'mixtral')


TRAIN_SCRIPT = """
import json, sys
import flax.linen as nn, fiddle as fdl, jax, numpy as np, optax
from paxlike.interop import checkpoint
from paxlike.core import partitioning
from paxlike.trainer import losses
from paxlike.core.partitioning import MeshConfig
cfg, host_params = checkpoint.load_hf_checkpoint(sys.argv[1], scan_layers=True)
model = fdl.build(cfg)
tokens = np.random.default_rng(0).integers(0, 61, (8, 13))
batch = {'inputs': tokens[:, :-1], 'targets': tokens[:, 1:], 'mask': np.ones((8, 12), np.float32)}
loss_fn, opt = losses.model_loss_fn(model), optax.sgd(0.5)
out = {}
for name, mesh_cfg in {'one': MeshConfig(ici=(1,)),
                       'data2_expert4': MeshConfig((2, 4), None, ('data', 'expert'))}.items():
  mesh = partitioning.make_mesh(mesh_cfg, jax.devices()[:1] if name == 'one' else None)
  with jax.set_mesh(mesh), nn.logical_axis_rules(
      partitioning.rules_for_mesh(mesh_cfg.rules, mesh)):
    boxed = jax.eval_shape(model.init, jax.random.key(0), batch['inputs'][:1])['params']
    shard = partitioning.logical_shardings(boxed, mesh, mesh_cfg.rules)
    params = jax.device_put(host_params, shard)
    data = partitioning.host_to_global(batch, partitioning.eval_batch_sharding(mesh))

    @jax.jit
    def step(p, state, b):
      (loss, metrics), grads = jax.value_and_grad(lambda q: loss_fn(q, b, None), has_aux=True)(p)
      updates, state = opt.update(grads, state, p)
      return optax.apply_updates(p, updates), state, loss, metrics['moe_dropped_fraction']

    state, rows = opt.init(params), []
    for _ in range(3):
      params, state, loss, dropped = step(params, state, data)
      rows.append([float(loss), float(dropped)])
    spec = str(params['blocks']['mlp']['wo'].sharding.spec)
  out[name] = {'rows': rows, 'wo_spec': spec}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_an_imported_qwen2_moe_trains_on_an_expert_mesh_as_on_one_device(tmp_path):
  cfg = hf_config('qwen2_moe', 'v5')
  write(tmp_path, ref.random_checkpoint(cfg), cfg)
  out = json.loads(run_script(TRAIN_SCRIPT.replace('sys.argv[1]', repr(str(tmp_path))))
                   .strip().splitlines()[-1])
  one, eight = out['one']['rows'], out['data2_expert4']['rows']
  assert one[-1][0] < one[0][0]  # It learns.
  assert all(dropped == 0.0 for _, dropped in one + eight)
  np.testing.assert_allclose([r[0] for r in eight], [r[0] for r in one], rtol=1e-5)
  assert "'expert'" in out['data2_expert4']['wo_spec']
