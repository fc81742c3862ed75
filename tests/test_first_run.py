"""A first run: print_config prepares nothing, the progress line shows MFU or TFLOP/s."""

import pytest

from paxlike.data import root
from paxlike.trainer.summaries import progress_line
from tests.helpers import cli_env, run_cli


def test_progress_line_shows_mfu_where_the_peak_is_known_else_tflops():
  row = {'step': 50, 'loss': 2.5, 'steps_per_sec': 10.0, 'tflops_per_sec': 123.4, 'mfu': 0.41}
  assert progress_line(row, 100) == ('step 50/100 (50%)  loss 2.5000  10.00 steps/s eta 0m05s  '
                                     'mfu 41.0%')
  del row['mfu']
  assert progress_line(row, 100).endswith('eta 0m05s  123 TFLOP/s')


@pytest.mark.parametrize('exp,params', [('federated.DigitsFedAvg', '# params: 55,210'),
                                        ('lm.ShakespeareTiny', '# params: ')])
def test_print_config_prepares_no_dataset(tmp_path, exp, params):
  tfds_dir = tmp_path / 'tfds'
  proc = run_cli(f'--exp={exp}', '--mode=print_config',
                 env=cli_env(**{root.TFDS_DIR_ENV: str(tfds_dir)}))
  assert params in proc.stdout
  assert not tfds_dir.exists()
