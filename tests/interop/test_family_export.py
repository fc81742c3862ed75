"""Export: every family is written as itself (architectures, model_type, fields) in a form the
independent reference reads back to the same logits; export -> reimport is exact; a merged
LoRA model exports; a from-scratch model exports as the family it matches or says why not;
the export directory appears only when complete."""

import json

import fiddle as fdl
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict, unflatten_dict

from paxlike import interop
from paxlike.errors import UserError
from paxlike.cli import hf_export
from paxlike.interop import checkpoint
from paxlike.layers import TransformerLM, lora
from tests.interop import checkpoints, reference

CASES = ['llama3.1', 'llama_yarn', 'mistral_window', 'qwen2', 'qwen3', 'phi3', 'gemma2',
         'gemma3_text']
ARCHITECTURES = {'llama': 'LlamaForCausalLM', 'mistral': 'MistralForCausalLM',
                 'qwen2': 'Qwen2ForCausalLM', 'qwen3': 'Qwen3ForCausalLM',
                 'phi3': 'Phi3ForCausalLM', 'gemma2': 'Gemma2ForCausalLM',
                 'gemma3_text': 'Gemma3ForCausalLM'}


def logits_of(model_cfg, params, tokens) -> np.ndarray:
  return np.asarray(fdl.build(model_cfg).apply({'params': params}, jnp.asarray(tokens)))


@pytest.mark.parametrize('case', CASES)
def test_export_is_the_family_and_reimports_exactly(tmp_path, case):
  cfg = checkpoints.v5(checkpoints.CASES[case])
  tensors = checkpoints.random_tensors(cfg)
  model_cfg, params = interop.load_hf_checkpoint(checkpoints.write(tmp_path / 'in', tensors, cfg),
                                                 scan_layers=True)
  model = fdl.build(model_cfg)
  out = tmp_path / 'out'
  # Phi-3 computes what Mistral does (only its tensors are fused): its source names it.
  source = cfg['model_type'] if case == 'phi3' else None  # Else found from the model alone.
  interop.save_hf_checkpoint(params, model, out, model_type=source)
  saved = json.loads((out / 'config.json').read_text())
  assert saved['model_type'] == cfg['model_type']
  assert saved['architectures'] == [ARCHITECTURES[cfg['model_type']]]
  again = interop.read_safetensors(out)
  assert again.keys() == tensors.keys()
  assert all(again[k].tobytes() == tensors[k].tobytes() for k in tensors)
  tokens = checkpoints.tokens(cfg)
  # The written config means the same model to the independent reference...
  np.testing.assert_allclose(reference.logits(again, saved, tokens),
                             reference.logits(tensors, cfg, tokens), rtol=1e-9, atol=1e-9)
  # ...and to paxlike.
  cfg_again, params_again = interop.load_hf_checkpoint(out, scan_layers=True)
  assert cfg_again == model_cfg
  np.testing.assert_array_equal(logits_of(cfg_again, params_again, tokens),
                                logits_of(model_cfg, params, tokens))


@pytest.mark.parametrize('case', ['qwen2', 'phi3', 'gemma3_text'])
def test_a_lora_model_exports_merged_and_reimports(tmp_path, case):
  cfg = checkpoints.CASES[case]
  tensors = checkpoints.random_tensors(cfg)
  model_cfg, params = interop.load_hf_checkpoint(checkpoints.write(tmp_path / 'in', tensors, cfg))
  model = fdl.build(model_cfg).clone(lora_rank=2, lora_targets=('query', 'value', 'wi_up'))
  tokens = checkpoints.tokens(cfg)
  fresh = flatten_dict(nn.unbox(model.init(jax.random.key(0), jnp.asarray(tokens))['params']))
  rng = np.random.default_rng(3)
  # The checkpoint's weights, and adapters whose B is not zero (so they change the logits).
  adapted = unflatten_dict({
      k: rng.standard_normal(v.shape).astype(np.float32) * 0.1 if k[-1].endswith('_lora_b')
      else np.asarray(v) for k, v in {**fresh, **flatten_dict(params)}.items()})
  want = np.asarray(model.apply({'params': adapted}, jnp.asarray(tokens)))
  merged = lora.merge_lora(adapted, model)
  interop.save_hf_checkpoint(merged, model.clone(lora_rank=0), tmp_path / 'out')
  cfg_again, params_again = interop.load_hf_checkpoint(tmp_path / 'out')
  np.testing.assert_allclose(logits_of(cfg_again, params_again, tokens), want, atol=2e-5,
                             rtol=2e-5)
  assert not np.allclose(want, logits_of(model_cfg, params, tokens), atol=1e-3)


def test_a_from_scratch_model_exports_as_its_family_or_says_why_not():
  assert interop.architecture_for_model(TransformerLM()).model_type == 'llama'
  gemma_like = TransformerLM(norm_weight_offset=1.0, sandwich_norm=True, scale_embeddings=True,
                             sliding_window=8, global_every=2, mlp_activation='gelu_tanh')
  assert interop.architecture_for_model(gemma_like).model_type == 'gemma2'
  assert interop.architecture_for_model(TransformerLM(qkv_bias=True)).model_type == 'qwen2'
  with pytest.raises(UserError, match='matches no Hugging Face family.*llama: sandwich_norm=True'):
    interop.architecture_for_model(TransformerLM(sandwich_norm=True))
  with pytest.raises(UserError, match='cannot be written as qwen2.*qk_norm=True'):
    interop.config_to_hf(TransformerLM(qk_norm=True, qkv_bias=True), 'qwen2')


def test_an_interrupted_export_leaves_no_out_and_a_rerun_succeeds(tmp_path):
  out = tmp_path / 'hf'
  leftover = tmp_path / '.hf.partial-killed'  # What a killed export left behind.
  leftover.mkdir()
  (leftover / 'model.safetensors').write_bytes(b'half')

  def dies_midway(tmp):
    (tmp / 'config.json').write_text('{}')
    raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    hf_export.write_atomically(out, dies_midway)
  assert not out.exists()
  assert sorted(p.name for p in tmp_path.iterdir()) == ['.hf.partial-killed']
  hf_export.write_atomically(out, lambda tmp: (tmp / 'config.json').write_text('{"ok": 1}'))
  assert json.loads((out / 'config.json').read_text()) == {'ok': 1}
  with pytest.raises(OSError):  # A complete export is never replaced.
    hf_export.write_atomically(out, lambda tmp: (tmp / 'config.json').write_text('{}'))
  assert json.loads((out / 'config.json').read_text()) == {'ok': 1}


def test_carried_keys_and_source_family(tmp_path):
  cfg = checkpoints.CASES['mistral']
  tensors = checkpoints.random_tensors(cfg)
  model_cfg, params = interop.load_hf_checkpoint(checkpoints.write(tmp_path / 'in', tensors, cfg))
  checkpoint.save_hf_checkpoint(params, fdl.build(model_cfg), tmp_path / 'out',
                                model_type='mistral', carried={'bos_token_id': 7})
  saved = json.loads((tmp_path / 'out' / 'config.json').read_text())
  assert saved['model_type'] == 'mistral' and saved['bos_token_id'] == 7
  assert saved['rope_parameters']['rope_theta'] == saved['rope_theta'] == 1e6
