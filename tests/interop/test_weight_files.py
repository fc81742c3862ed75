"""Which files and tensors a Hugging Face checkpoint directory is made of, as transformers
decides it: the index is the truth (stray files beside shards are ignored), model.safetensors
alone else, and index-less shards that both hold a tensor, or a shard the index names that is
absent, are refused by name."""

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from paxlike import interop
from paxlike.errors import UserError
from paxlike.interop import checkpoint
from tests.interop import checkpoints, reference
from tests.interop.test_family_logits import TOLERANCE, paxlike_logits, relative_error
from tests.interop.test_saved_configs import write_shards

CFG = checkpoints.CASES['llama2']


@pytest.fixture
def tensors():
  return checkpoints.random_tensors(CFG)


def other(tensors: dict) -> dict:
  """The same names and shapes, other values (a stale copy: reading it would be wrong)."""
  return {k: (v + 1).astype(v.dtype) for k, v in tensors.items()}


def consolidated(tensors: dict) -> dict:
  """Mistral's native layout of a checkpoint, as its repos ship it beside the HF files."""
  return {k.replace('model.layers.', 'layers.').replace('self_attn.q_proj', 'attention.wq'): v
          for k, v in other(tensors).items()}


def assert_reads(directory, tensors: dict) -> None:
  got = checkpoint.read_safetensors(directory)
  assert got.keys() == tensors.keys()
  assert all(np.array_equal(got[k], v) for k, v in tensors.items())
  header = checkpoint.safetensors_header(directory)
  assert {k: s for k, (s, _) in header.items()} == {k: v.shape for k, v in tensors.items()}


def test_stray_files_beside_an_indexed_checkpoint_are_ignored(tmp_path, tensors):
  write_shards(tmp_path, tensors)
  save_file(other(tensors), str(tmp_path / 'model.safetensors'))  # A stale single-file copy.
  save_file(consolidated(tensors), str(tmp_path / 'consolidated.safetensors'))
  (tmp_path / 'config.json').write_text(json.dumps(CFG))
  assert_reads(tmp_path, tensors)
  tokens = checkpoints.tokens(CFG)
  ref = reference.logits(tensors, CFG, tokens)
  assert relative_error(paxlike_logits(tmp_path, tokens), ref) < TOLERANCE  # As a run loads it.


def test_model_safetensors_alone_is_read_beside_a_consolidated_file(tmp_path, tensors):
  save_file(tensors, str(tmp_path / 'model.safetensors'))
  save_file(consolidated(tensors), str(tmp_path / 'consolidated.safetensors'))
  assert_reads(tmp_path, tensors)


def test_index_less_shards_are_read_together(tmp_path, tensors):
  names = sorted(tensors)
  save_file({k: tensors[k] for k in names[::2]}, str(tmp_path / 'a.safetensors'))
  save_file({k: tensors[k] for k in names[1::2]}, str(tmp_path / 'b.safetensors'))
  assert_reads(tmp_path, tensors)


def test_a_tensor_in_two_index_less_shards_is_refused(tmp_path, tensors):
  save_file(tensors, str(tmp_path / 'part-1.safetensors'))
  save_file({'model.norm.weight': other(tensors)['model.norm.weight']},
            str(tmp_path / 'part-2.safetensors'))
  message = 'model.norm.weight is in both part-1.safetensors and part-2.safetensors'
  with pytest.raises(UserError, match=message):
    checkpoint.read_safetensors(tmp_path)
  with pytest.raises(UserError, match=message):
    checkpoint.safetensors_header(tmp_path)


def test_a_missing_shard_is_named_by_its_file(tmp_path, tensors):
  write_shards(tmp_path, tensors)
  (tmp_path / 'model-00002-of-00003.safetensors').unlink()
  (tmp_path / 'config.json').write_text(json.dumps(CFG))
  message = 'model-00002-of-00003.safetensors is missing from .*model.safetensors.index.json'
  with pytest.raises(UserError, match=message):
    checkpoint.safetensors_header(tmp_path)
  with pytest.raises(UserError, match=message):
    interop.load_hf_checkpoint(tmp_path)


def test_a_tensor_the_index_places_in_a_shard_that_lacks_it_is_named(tmp_path, tensors):
  write_shards(tmp_path, tensors)
  index = json.loads((tmp_path / 'model.safetensors.index.json').read_text())
  name = sorted(index['weight_map'])[0]
  shard = 'model-00003-of-00003.safetensors'
  index['weight_map'][name] = shard if index['weight_map'][name] != shard else \
      'model-00001-of-00003.safetensors'
  (tmp_path / 'model.safetensors.index.json').write_text(json.dumps(index))
  with pytest.raises(UserError, match=f'does not hold {name}, which model.safetensors.index'):
    checkpoint.safetensors_header(tmp_path)
