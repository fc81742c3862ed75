"""A TransformerLM trained as a 4-stage GPipe pipeline (4 stage x 2 data, 2 microbatches) logs
the 1-device run's rows; bad pipeline input is one line, exit 2, before anything is written."""

import pytest

from tests.helpers import TINY, metric_rows, run_cli

STAGE = [*TINY, '--fdl_fiddler=cpu8_stage']


def test_pipelined_rows_equal_one_device(tmp_path):
  run_cli(*TINY, '--fdl_set=model.scan_layers=True', '--fdl_set=model.num_layers=4',
          f'--job_log_dir={tmp_path / "one"}', devices=1)
  run_cli(*STAGE, f'--job_log_dir={tmp_path / "stage"}', devices=8)
  one, stage = metric_rows(tmp_path / 'one'), metric_rows(tmp_path / 'stage')
  assert [r['step'] for r in stage] == [r['step'] for r in one]
  for a, b in zip(one, stage):
    assert a.keys() == b.keys()
    for key, value in a.items():
      assert b[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (a['step'], key)


@pytest.mark.parametrize('override,message', [
    ('train.microbatches=3', 'train.microbatches=3 does not divide the per-stage batch'),
    ('model.num_layers=6', "mesh axis 'stage' of size 4 does not divide model.num_layers=6"),
    ('model.scan_layers=False', "a 'stage' mesh axis pipelines the scanned stack"),
])
def test_bad_pipeline_input_is_one_line_exit_2(tmp_path, override, message):
  proc = run_cli(*STAGE, f'--fdl_set={override}', f'--job_log_dir={tmp_path / "job"}',
                 devices=8, check=False)
  assert proc.returncode == 2 and message in proc.stderr
  assert len(proc.stderr.strip().splitlines()) == 1
  assert not (tmp_path / 'job').exists() or not any((tmp_path / 'job').iterdir())
