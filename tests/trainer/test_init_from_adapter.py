"""A PEFT adapter directory (adapter_config.json + adapter_model.safetensors, no config.json)
given as train.init_from is refused in one line, exit 2, naming what it is and what to pass
(paxlike/trainer/init_from.py `adapter_refusal`)."""

import json

import numpy as np
from safetensors.numpy import save_file

from paxlike.interop import hf_llama
from paxlike.layers import TransformerLM
from tests.helpers import TINY, run_cli
from tests.tiny_task import SMALL


def write_adapter(directory, base: str) -> None:
  """What PEFT's save_pretrained writes for a LoRA on q_proj and v_proj of one layer."""
  directory.mkdir(parents=True)
  (directory / 'adapter_config.json').write_text(json.dumps(
      {'peft_type': 'LORA', 'task_type': 'CAUSAL_LM', 'base_model_name_or_path': base, 'r': 4,
       'lora_alpha': 8, 'target_modules': ['q_proj', 'v_proj'], 'lora_dropout': 0.0}))
  zeros = lambda *shape: np.zeros(shape, np.float32)
  save_file({'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight': zeros(4, 32),
             'base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight': zeros(32, 4)},
            str(directory / 'adapter_model.safetensors'))


def init_from(tmp_path, source):
  return run_cli(*TINY, *(f'--fdl_set={o}' for o in SMALL), f'--job_log_dir={tmp_path / "j"}',
                 f'--fdl_set=train.init_from=hf:{source}', check=False)


def test_an_adapter_of_a_local_base_is_refused_naming_the_base_to_pass(tmp_path):
  base = tmp_path / 'base'
  base.mkdir()
  (base / 'config.json').write_text(json.dumps(hf_llama.config_to_hf(TransformerLM())))
  write_adapter(tmp_path / 'adapter', str(base))
  proc = init_from(tmp_path, tmp_path / 'adapter')
  assert proc.returncode == 2, proc.stderr[-2000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.endswith(
      f"{tmp_path / 'adapter'} is a PEFT LORA adapter (r=4, lora_alpha=8, target_modules="
      f"['q_proj', 'v_proj']) for the base {str(base)!r}, not a checkpoint; paxlike does not "
      "apply adapters at init_from: merge it into its base with PEFT "
      "(model.merge_and_unload().save_pretrained(DIR)) and pass hf:DIR, or pass the base as "
      f"train.init_from=hf:{base} to train a fresh adapter (model.lora_rank) from the base "
      "alone"), proc.stderr
  assert not (tmp_path / 'j' / 'config.json').exists()


def test_an_adapter_of_a_hub_base_says_to_pass_a_local_copy(tmp_path):
  write_adapter(tmp_path / 'adapter', 'meta-llama/Llama-3.2-1B')
  proc = init_from(tmp_path, tmp_path / 'adapter')
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1].endswith(
      "or pass the base 'meta-llama/Llama-3.2-1B' as train.init_from=hf:DIR, a local Hugging "
      "Face directory (nothing is downloaded) to train a fresh adapter (model.lora_rank) from "
      "the base alone"), proc.stderr
