"""The config.json files transformers' own config classes wrote (`save_pretrained`, committed
under tests/fixtures/hf_configs/<version>/, see write_configs.py there) load as they are, with
random weights in both file layouts (one model.safetensors; shards named by an index), to the
float64 references' logits; and a config that omits a key gets the value the family's config
class fills in (its `defaults/config.json`: what the class wrote given only the required keys).
"""

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from paxlike import interop
from paxlike.interop import hf_fields
from tests.interop import checkpoints, moe_reference, reference
from tests.interop.test_family_logits import TOLERANCE, paxlike_logits, relative_error

FIXTURES = Path(__file__).parents[1] / 'fixtures' / 'hf_configs'
VERSION = '5.17.0'
MOE = ('mixtral', 'qwen2_moe', 'qwen3_moe')


def saved(model_type: str, *parts: str) -> dict:
  return json.loads(FIXTURES.joinpath(VERSION, model_type, *parts, 'config.json').read_text())


def write_shards(directory: Path, tensors: dict, shards: int = 3) -> None:
  """`tensors` as transformers writes a sharded checkpoint: model-0000i-of-0000n.safetensors
  and model.safetensors.index.json naming each tensor's file."""
  names, weight_map = sorted(tensors), {}
  for i in range(shards):
    file = f'model-{i + 1:05d}-of-{shards:05d}.safetensors'
    part = names[i::shards]
    save_file({n: tensors[n] for n in part}, str(directory / file), metadata={'format': 'pt'})
    weight_map |= {n: file for n in part}
  total = sum(t.nbytes for t in tensors.values())
  (directory / 'model.safetensors.index.json').write_text(json.dumps(
      {'metadata': {'total_size': total}, 'weight_map': weight_map}))


def tensors_and_reference(cfg: dict, tokens: np.ndarray) -> tuple[dict, np.ndarray]:
  if cfg['model_type'] not in MOE:
    tensors = checkpoints.random_tensors(cfg)
    return tensors, reference.logits(tensors, cfg, tokens)
  # transformers' attribute_map: Qwen3-MoE saves num_experts as num_local_experts.
  cfg = {'num_experts': cfg.get('num_local_experts'), **cfg}
  tensors = moe_reference.random_checkpoint(cfg)
  return tensors, moe_reference.moe_logits(tensors, cfg, tokens)


def test_the_fixtures_are_every_supported_model_type():
  assert sorted(p.name for p in (FIXTURES / VERSION).iterdir()) == sorted(interop.ARCHITECTURES)


@pytest.mark.parametrize('layout', ['single', 'sharded'])
@pytest.mark.parametrize('model_type', sorted(interop.ARCHITECTURES))
def test_a_config_transformers_saved_loads_to_the_reference_logits(tmp_path, model_type, layout):
  text = FIXTURES.joinpath(VERSION, model_type, 'config.json').read_text()
  cfg = json.loads(text)
  tokens = checkpoints.tokens(cfg)
  tensors, ref = tensors_and_reference(cfg, tokens)
  if layout == 'single':
    save_file(tensors, str(tmp_path / 'model.safetensors'), metadata={'format': 'pt'})
  else:
    write_shards(tmp_path, tensors)
  (tmp_path / 'config.json').write_text(text)  # Byte for byte what transformers wrote.
  error = relative_error(paxlike_logits(tmp_path, tokens), ref)
  print(f'{model_type} {layout}: max relative logit error {error:.2e}')
  assert error < TOLERANCE


@pytest.mark.parametrize('model_type', sorted(interop.ARCHITECTURES))
def test_an_omitted_key_gets_the_config_class_default(model_type):
  filled = saved(model_type, 'defaults')
  minimal = {k: filled[k] for k in ('model_type', *hf_fields.REQUIRED)}
  assert interop.config_from_hf(minimal) == interop.config_from_hf(filled)


def test_the_defaults_differ_from_a_generic_guess():
  """The defaults test can fail: the classes' defaults are not hidden_size / heads etc."""
  qwen3, gemma2 = saved('qwen3', 'defaults'), saved('gemma2', 'defaults')
  assert (qwen3['head_dim'], gemma2['head_dim']) == (128, 256) != (64 // 32,) * 2
  assert saved('mistral', 'defaults')['sliding_window'] == 4096
  assert saved('phi3', 'defaults')['rms_norm_eps'] == 1e-5
