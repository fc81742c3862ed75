"""train.init_from=hf:ADAPTER (a PEFT LoRA adapter dir; its base the one adapter_config.json
names, or hf:ADAPTER@BASE) starts from the base with the adapter as paxlike's LoRA params: its
logits are the float64 reference's of the base with W + s·B·A merged in numpy, the HF export's
merge writes exactly those weights, and what has no paxlike counterpart is refused in one line
naming the key (paxlike/interop/peft.py)."""

import json
import math

import fiddle as fdl
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import NamedSharding, PartitionSpec as P

from paxlike import interop
from paxlike.errors import UserError
from paxlike.layers import TransformerLM, lora
from paxlike.trainer import init_from
from tests.interop import checkpoints, moe_reference, peft_adapters, reference, test_moe_families

LLAMA_ALL = ('q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj')
PHI3_ALL = ('qkv_proj', 'o_proj', 'gate_up_proj', 'down_proj')


def start(source: str, **fields) -> tuple[TransformerLM, dict]:
  """The model and params a run with train.init_from=`source` starts from (the CLI's model
  fields from `model_overrides_from`, the params streamed by `load_params`)."""
  model = fdl.build(fdl.Config(TransformerLM, **{**init_from.model_overrides_from(source),
                                                 **fields}))
  tokens = jnp.zeros((1, 4), jnp.int32)
  shapes = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), tokens))['params'])
  replicated = NamedSharding(jax.make_mesh((1,), ('data',)), P())
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                          shapes)
  placed = init_from.load_params(source, abstract, model, lora.lora_mask)
  return model, jax.device_get(traverse_util.unflatten_dict(placed, sep='/'))


def relative_error(logits: np.ndarray, ref: np.ndarray) -> float:
  return float(np.max(np.abs(logits - ref)) / np.max(np.abs(ref)))


def setup(tmp_path, case: str, suffixes: tuple[str, ...], r: int = 4, alpha: float = 8,
          named_base: bool = True, **config):
  """(HF config, base tensors, adapter tensors, adapter dir) of `case` with a LoRA on the
  modules ending in `suffixes`."""
  cfg = checkpoints.CASES[case]
  tensors = checkpoints.random_tensors(cfg)
  base = checkpoints.write(tmp_path / 'base', tensors, cfg)
  adapted = peft_adapters.modules(tensors, suffixes)
  adapter = tmp_path / 'adapter'
  weights = peft_adapters.write(adapter, tensors, adapted, str(base) if named_base else 'org/m',
                                r=r, alpha=alpha, **config)
  return cfg, tensors, weights, adapter


@pytest.mark.parametrize('case, suffixes, rslora, scanned', [
    ('llama2', LLAMA_ALL, False, False),
    ('llama2', ('q_proj', 'v_proj'), True, True),
    ('phi3', PHI3_ALL, False, False),
    ('qwen3', ('k_proj', 'o_proj', 'up_proj'), False, True),
    ('gemma2', ('q_proj', 'down_proj'), False, False),
])
def test_logits_are_the_references_of_the_merged_base(tmp_path, case, suffixes, rslora, scanned):
  cfg, tensors, weights, adapter = setup(tmp_path, case, suffixes, r=4, alpha=8,
                                         use_rslora=rslora)
  tokens = checkpoints.tokens(cfg)
  ref = reference.logits(peft_adapters.merged(tensors, weights, 4, 8, rslora), cfg, tokens)
  model, params = start(f'hf:{adapter}', scan_layers=scanned)
  assert model.lora_rank == 4
  assert model.lora_alpha == pytest.approx(8 * math.sqrt(4) if rslora else 8, rel=1e-12)
  got = np.asarray(jax.jit(model.apply)({'params': params}, jnp.asarray(tokens)))
  error = relative_error(got, ref)
  base = reference.logits(tensors, cfg, tokens)
  print(f'{case}: max relative logit error {error:.2e} (the base alone: '
        f'{relative_error(got, base):.2e})')
  assert error < 2e-5
  assert relative_error(got, base) > 1e-2  # The adapter changes the logits.


def test_the_export_merges_the_loaded_adapter_into_the_weights(tmp_path):
  """What the HF export does with a LoRA job's params (lora.merge_lora, then the family's
  tensors) writes W + s·B·A of the source's W, A and B."""
  cfg, tensors, weights, adapter = setup(tmp_path, 'phi3', PHI3_ALL, r=2, alpha=6)
  model, params = start(f'hf:{adapter}')
  merged = lora.merge_lora(params, model)
  interop.save_hf_checkpoint(merged, model.clone(lora_rank=0), tmp_path / 'out',
                             model_type='phi3')
  out = interop.read_safetensors(tmp_path / 'out')
  want = peft_adapters.merged(tensors, weights, 2, 6)
  assert set(out) == set(want)
  for name, value in want.items():
    np.testing.assert_allclose(out[name], value, rtol=2e-6, atol=2e-6, err_msg=name)


def test_an_explicit_base_after_at_and_the_record(tmp_path):
  cfg, tensors, weights, adapter = setup(tmp_path, 'llama2', ('v_proj',), named_base=False)
  source = f'hf:{adapter}@{tmp_path / "base"}'
  model, params = start(source)
  assert model.lora_targets == ('value',)
  np.testing.assert_array_equal(
      params['block_1']['attention']['value_lora_b'],
      weights['base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight'].T.reshape(4, 2, 8))
  record = init_from.source_record(source)
  assert record['path'] == str(tmp_path / 'base') and record['adapter'] == str(adapter)
  assert {'model.safetensors', 'config.json', 'adapter/adapter_config.json',
          'adapter/adapter_model.safetensors'} == set(record['files'])


def test_a_config_json_beside_the_adapter_or_adapter_files_beside_a_base(tmp_path):
  """Some trainers save the base's config.json with the adapter: still an adapter. A base
  with a PEFT adapter's files left beside its index-less shards: the base alone."""
  cfg, tensors, weights, adapter = setup(tmp_path, 'llama2', ('q_proj',))
  (adapter / 'config.json').write_text(json.dumps(cfg))
  assert init_from.parse(f'hf:{adapter}').adapter == adapter
  base = tmp_path / 'base'
  (base / 'model.safetensors').rename(base / 'model-00001-of-00001.safetensors')
  for name in ('adapter_config.json', 'adapter_model.safetensors'):
    (base / name).write_bytes((adapter / name).read_bytes())
  model, params = start(f'hf:{base}')
  assert model.lora_rank == 0
  np.testing.assert_array_equal(params['lm_head']['kernel'], tensors['lm_head.weight'].T)


def test_the_adapters_tokenizer_comes_first(tmp_path):
  *_, adapter = setup(tmp_path, 'llama2', ('q_proj',))
  (tmp_path / 'base' / 'tokenizer.json').write_text('{}')
  assert init_from.init_source_tokenizer(f'hf:{adapter}') == str(tmp_path / 'base' /
                                                                  'tokenizer.json')
  (adapter / 'tokenizer.json').write_text('{}')
  assert init_from.init_source_tokenizer(f'hf:{adapter}') == str(adapter / 'tokenizer.json')


def refusal(call) -> str:
  with pytest.raises(UserError) as error:
    call()
  message = str(error.value)
  assert '\n' not in message
  return message


def test_a_hub_base_or_a_base_without_config_says_what_to_pass(tmp_path):
  *_, adapter = setup(tmp_path, 'llama2', ('q_proj',), named_base=False)
  assert refusal(lambda: init_from.parse(f'hf:{adapter}')) == (
      f"train.init_from='hf:{adapter}': {adapter} is a PEFT LORA adapter (r=4, lora_alpha=8, "
      "target_modules=['q_proj']) for the base 'org/m', which is not a local directory holding "
      f"a config.json: pass a local copy of it as train.init_from=hf:{adapter}@BASE_DIR "
      '(nothing is downloaded)')
  assert refusal(lambda: init_from.parse(f'hf:{adapter}@{tmp_path}')).endswith(
      f'the base given after @, {tmp_path}, holds no config.json')
  assert refusal(lambda: init_from.parse(f'hf:{tmp_path / "base"}@{tmp_path / "base"}')).endswith(
      f'{tmp_path / "base"} is no PEFT adapter directory (adapter_config.json and no model '
      'weights): hf:ADAPTER@BASE loads an adapter onto BASE')


CONFIG_REFUSALS = {
    'use_dora': True, 'modules_to_save': ['lm_head'], 'rank_pattern': {'q_proj': 8},
    'alpha_pattern': {'v_proj': 32}, 'layers_to_transform': [0], 'bias': 'lora_only',
    'lora_bias': True, 'fan_in_fan_out': True, 'layer_replication': [[0, 2]],
    'init_lora_weights': 'pissa_niter_4',  # Trained on the base's residual, not converted.
}


@pytest.mark.parametrize('key', sorted(CONFIG_REFUSALS))
def test_config_keys_without_a_counterpart_are_refused_naming_the_key(tmp_path, key):
  *_, adapter = setup(tmp_path, 'llama2', ('q_proj',), **{key: CONFIG_REFUSALS[key]})
  assert refusal(lambda: init_from.model_overrides_from(f'hf:{adapter}')) == (
      f'{adapter / "adapter_config.json"}: {key}={CONFIG_REFUSALS[key]!r} has no paxlike LoRA '
      'counterpart (only plain LoRA on every layer of the attention and MLP projections, one '
      'rank and alpha, loads); merge it into its base with PEFT '
      '(merge_and_unload().save_pretrained(DIR)) and pass hf:DIR')


def add_tensors(adapter, **extra):
  from safetensors.numpy import load_file, save_file  # pylint: disable=import-outside-toplevel
  tensors = {**load_file(adapter / 'adapter_model.safetensors'), **extra}
  save_file(tensors, str(adapter / 'adapter_model.safetensors'))


def test_weights_without_a_counterpart_are_refused_naming_the_key(tmp_path):
  cfg, tensors, weights, adapter = setup(tmp_path, 'llama2', ('q_proj',))
  file = adapter / 'adapter_model.safetensors'
  dora = 'base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector'
  add_tensors(adapter, **{dora: np.ones(32, np.float32)})
  assert refusal(lambda: init_from.model_overrides_from(f'hf:{adapter}')) == (
      f'{file}: {dora} is not a LoRA lora_A/lora_B weight (DoRA magnitudes, modules_to_save '
      'copies, biases and embedding adapters cannot be mapped)')
  setup(tmp_path, 'llama2', ('q_proj', 'lm_head'))
  head = 'base_model.model.lm_head.lora_A.weight'
  assert refusal(lambda: init_from.model_overrides_from(f'hf:{adapter}')) == (
      f'{file}: {head} adapts lm_head, which paxlike LoRA does not (lm_head)')
  setup(tmp_path, 'llama2', ('q_proj',))
  rotary = 'base_model.model.model.layers.0.self_attn.rotary_emb.lora_'
  add_tensors(adapter, **{rotary + 'A.weight': np.ones((4, 32), np.float32),
                          rotary + 'B.weight': np.ones((32, 4), np.float32)})
  assert refusal(lambda: init_from.model_overrides_from(f'hf:{adapter}')) == (
      f'{file}: {rotary}A.weight adapts model.layers.0.self_attn.rotary_emb, no linear layer of '
      'the base; paxlike LoRA adapts query, key, value, out, wi_gate, wi_up, wi, wo')
  setup(tmp_path, 'llama2', ('q_proj',))
  add_tensors(adapter, **{'base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight':
                          np.ones((4, 32), np.float32)})
  assert refusal(lambda: init_from.model_overrides_from(f'hf:{adapter}')) == (
      f'{file}: base_model.model.model.layers.9.self_attn.q_proj.lora_B.weight is missing')


def test_an_adapter_on_some_layers_only_is_refused(tmp_path):
  cfg, tensors, weights, adapter = setup(tmp_path, 'llama2', ('layers.0.self_attn.q_proj',))
  assert refusal(lambda: start(f'hf:{adapter}')) == (
      f'{adapter / "adapter_model.safetensors"} has no LoRA for paxlike '
      'block_1/attention/query_lora_a (2 in all): an adapter on some layers or modules only '
      'cannot be loaded')


def test_a_model_whose_lora_fields_differ_is_told_what_to_set(tmp_path):
  *_, adapter = setup(tmp_path, 'llama2', ('q_proj', 'v_proj'), r=4, alpha=8)
  message = refusal(lambda: start(f'hf:{adapter}', lora_rank=16, lora_alpha=16.0,
                                  lora_targets=('query', 'key', 'value', 'out')))
  assert message == (
      f"{adapter} is a LoRA of r=4 (scale 2) on query, value, but the model has lora_rank=16, "
      "lora_alpha=16.0, lora_targets=('query', 'key', 'value', 'out'): pass "
      "--fdl_set=model.lora_rank=4 --fdl_set=model.lora_alpha=8.0 "
      "\"--fdl_set=model.lora_targets=('query', 'value')\"")
  assert 'lora_rank=0' in refusal(lambda: start(f'hf:{adapter}', lora_rank=0))


def test_other_adapter_kinds_and_files_are_refused(tmp_path):
  *_, adapter = setup(tmp_path, 'llama2', ('q_proj',), peft_type='IA3')
  assert refusal(lambda: init_from.model_overrides_from(f'hf:{adapter}')) == (
      f"{adapter / 'adapter_config.json'}: peft_type='IA3' cannot be loaded; only 'LORA' "
      "adapters map onto paxlike's LoRA")
  setup(tmp_path, 'llama2', ('q_proj',))
  (adapter / 'adapter_model.safetensors').rename(adapter / 'adapter_model.bin')
  assert refusal(lambda: init_from.model_overrides_from(f'hf:{adapter}')) == (
      f'{adapter}: no adapter_model.safetensors (adapter_model.bin, a pickle, is not read: save '
      'it with safe_serialization=True)')
  (adapter / 'adapter_model.bin').unlink()
  setup(tmp_path, 'llama2', ('q_proj',), r=4)
  config = json.loads((adapter / 'adapter_config.json').read_text())
  (adapter / 'adapter_config.json').write_text(json.dumps({**config, 'r': 8}))
  assert refusal(lambda: init_from.model_overrides_from(f'hf:{adapter}')).startswith(
      f'{adapter / "adapter_model.safetensors"}: base_model.model.model.layers.0.self_attn.'
      'q_proj.lora_A.weight is [4, 32], not A [r, in] with r=8')


@pytest.mark.parametrize('scanned', [False, True])
def test_an_attention_adapter_on_a_moe_base(tmp_path, scanned):
  """Qwen3-MoE with a dense layer 0 and a MoE layer 1 (a scanned step is a group of both)."""
  cfg = test_moe_families.hf_config('qwen3_moe_step2', 'v4')
  tensors = moe_reference.random_checkpoint(cfg)
  test_moe_families.write(tmp_path / 'base', tensors, cfg)
  adapted = peft_adapters.modules(tensors, ('q_proj', 'o_proj'))
  weights = peft_adapters.write(tmp_path / 'adapter', tensors, adapted, str(tmp_path / 'base'))
  model, params = start(f'hf:{tmp_path / "adapter"}', scan_layers=scanned)
  tokens = test_moe_families.TOKENS
  got = np.asarray(model.apply({'params': params}, jnp.asarray(tokens)))
  want = moe_reference.moe_logits(peft_adapters.merged(tensors, weights, 4, 8), cfg, tokens)
  assert relative_error(got, want) < 2e-5
  expert = 'model.layers.1.mlp.experts.0.gate_proj'
  peft_adapters.write(tmp_path / 'adapter', tensors, [expert], str(tmp_path / 'base'))
  assert refusal(lambda: init_from.model_overrides_from(f'hf:{tmp_path / "adapter"}')) == (
      f'{tmp_path / "adapter" / "adapter_model.safetensors"}: base_model.model.{expert}.lora_A.'
      f'weight adapts {expert}, an expert row of a stacked kernel; paxlike LoRA adapts query, '
      'key, value, out, wi_gate, wi_up, wi, wo')


def test_an_adapter_on_an_int8_quantized_base(tmp_path):
  """QLoRA: the base quantized as it streams in, the adapter's factors as they are."""
  cfg, tensors, weights, adapter = setup(tmp_path, 'llama2', ('v_proj', 'down_proj'))
  model, params = start(f'hf:{adapter}', base_quantization='int8')
  b = weights['base_model.model.model.layers.0.mlp.down_proj.lora_B.weight']
  np.testing.assert_array_equal(params['block_0']['mlp']['wo_lora_b'], b.T)
  tokens = checkpoints.tokens(cfg)
  got = np.asarray(jax.jit(model.apply)({'params': params}, jnp.asarray(tokens)))
  ref = reference.logits(peft_adapters.merged(tensors, weights, 4, 8), cfg, tokens)
  assert relative_error(got, ref) < 5e-2  # int8's rounding of the base...
  assert relative_error(got, reference.logits(tensors, cfg, tokens)) > 0.5  # ...not the adapter.
