"""A bad file ends in one line: a UserError from the library, exit 2 with that line (and no
traceback) from the CLI: a truncated config.json, a float8 tensor (a quantized checkpoint,
which paxlike does not read), RoPE scaling with a factor of 0 or below."""

import json
import re

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from paxlike import interop
from paxlike.errors import UserError
from paxlike.interop import checkpoint
from paxlike.trainer import init_from
from tests.helpers import TINY, run_cli
from tests.interop import checkpoints
from tests.tiny_task import SMALL, tiny_task
from tests.trainer.test_init_from import write_hf_dir

LLAMA = checkpoints.CASES['llama2']


def truncate_config(directory) -> str:
  text = (directory / 'config.json').read_text()
  (directory / 'config.json').write_text(text[:len(text) // 2])
  return 'config.json is not JSON'


def float8_tensor(directory) -> str:
  tensors = checkpoint.read_safetensors(directory)
  tensors['model.norm.weight'] = tensors['model.norm.weight'].astype(ml_dtypes.float8_e4m3fn)
  save_file(tensors, str(directory / 'model.safetensors'))
  return 'model.safetensors holds model.norm.weight in F8_E4M3: a quantized checkpoint'


def zero_rope_factor(directory) -> str:
  cfg = json.loads((directory / 'config.json').read_text())
  cfg.pop('rope_parameters', None)  # transformers 4's layout (both are read the same way).
  cfg['rope_scaling'] = {'rope_type': 'linear', 'factor': 0.0}
  (directory / 'config.json').write_text(json.dumps(cfg))
  return r'rope_scaling.factor=0.0 is not positive'


BAD = {'truncated_config': truncate_config, 'float8_tensor': float8_tensor,
       'zero_rope_factor': zero_rope_factor}


@pytest.mark.parametrize('factor', [0.0, -2.0, float('nan')])
@pytest.mark.parametrize('kind', ['linear', 'dynamic', 'llama3', 'yarn'])
def test_rope_scaling_factor_at_or_below_zero_is_refused(kind, factor):
  scaling = {'rope_type': kind, 'factor': factor}
  if kind in ('llama3', 'yarn'):
    scaling['original_max_position_embeddings'] = 16
  if kind == 'llama3':
    scaling |= {'low_freq_factor': 1.0, 'high_freq_factor': 4.0}
  for cfg in ({**LLAMA, 'rope_scaling': scaling}, checkpoints.v5({**LLAMA, 'rope_scaling': scaling})):
    with pytest.raises(UserError, match=f'factor={factor} is not positive'):
      interop.config_from_hf(cfg)


def test_a_positive_factor_below_one_still_loads():
  """transformers warns under 1 but computes: only <= 0 is nonsense."""
  interop.config_from_hf({**LLAMA, 'rope_scaling': {'rope_type': 'linear', 'factor': 0.5}})


@pytest.mark.parametrize('bad', sorted(BAD))
def test_the_library_raises_one_user_error(tmp_path, bad):
  checkpoints.write(tmp_path, checkpoints.random_tensors(LLAMA), LLAMA)
  message = BAD[bad](tmp_path)
  with pytest.raises(UserError, match=message):
    init_from.model_overrides_from(f'hf:{tmp_path}')  # What a run reads first,
    checkpoint.safetensors_header(tmp_path)  # then the headers,
  with pytest.raises(UserError, match=message):
    interop.load_hf_checkpoint(tmp_path)  # and the in-memory load.


@pytest.mark.parametrize('bad', sorted(BAD))
def test_the_cli_exits_2_with_one_line(tmp_path, bad):
  source = tmp_path / 'hf'
  write_hf_dir(source, tiny_task().model)
  message = BAD[bad](source)
  proc = run_cli(*TINY, *(f'--fdl_set={o}' for o in SMALL), f'--job_log_dir={tmp_path / "job"}',
                 f'--fdl_set=train.init_from=hf:{source}', '--fdl_set=train.num_steps=1',
                 check=False)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert 'Traceback' not in proc.stderr
  last = proc.stderr.strip().splitlines()[-1]
  assert re.search(message, last), last
