"""A TransformerLM trained as a 4-stage GPipe pipeline (4 stage x 2 data, 2 microbatches) logs
the 1-device run's rows (so does 2 stage x 2 data x 2 model with gradient accumulation), and a killed pipelined run resumes
to the uninterrupted run's rows;
bad pipeline input is one line, exit 2, before anything is written."""

from pathlib import Path

import pytest

from tests.helpers import TINY, kill_after_first_checkpoint, metric_rows, run_cli

STAGE = [*TINY, '--fdl_fiddler=cpu8_stage']


def _assert_rows_close(one: list[dict], got: list[dict]) -> None:
  assert [r['step'] for r in got] == [r['step'] for r in one]
  for a, b in zip(one, got):
    assert a.keys() == b.keys()
    for key, value in a.items():
      assert b[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (a['step'], key)


def _one_device_rows(job: Path, *extra: str) -> list[dict]:
  run_cli(*TINY, '--fdl_set=model.scan_layers=True', '--fdl_set=model.num_layers=4', *extra,
          f'--job_log_dir={job}', devices=1)
  return metric_rows(job)


@pytest.mark.slow
def test_pipelined_rows_equal_one_device_and_resume_exactly(tmp_path):
  # 6 steps (a step is ~1 s here: 8 devices on 2 cores), checkpoints at 2, 4 and 6.
  short = ('--fdl_set=train.num_steps=6', '--fdl_set=train.checkpoint_every=2')
  run_cli(*STAGE, *short, f'--job_log_dir={tmp_path / "stage"}', devices=8)
  stage = metric_rows(tmp_path / 'stage')
  _assert_rows_close(_one_device_rows(tmp_path / 'one', *short), stage)
  # Crash-exact resume on the stage mesh: killed after its first checkpoint, then resumed.
  killed = tmp_path / 'killed'
  committed = kill_after_first_checkpoint(*STAGE, *short, job_dir=killed, devices=8)
  assert committed and max(committed) < 6
  run_cli(*STAGE, *short, f'--job_log_dir={killed}', devices=8)
  assert metric_rows(killed) == stage


@pytest.mark.slow
def test_stages_compose_with_data_tensor_parallelism_and_gradient_accumulation(tmp_path):
  # Two micro-batches, each pipelined; 4 steps.
  accumulate = ('--fdl_set=data.local_steps=2', '--fdl_set=train.num_steps=4')
  run_cli(*STAGE, *accumulate, '--fdl_set=mesh.ici=(2,2,2)',
          "--fdl_set=mesh.axes=('stage','data','model')",
          f'--job_log_dir={tmp_path / "stage_data_model"}', devices=8)
  _assert_rows_close(_one_device_rows(tmp_path / 'one', *accumulate),
                     metric_rows(tmp_path / 'stage_data_model'))


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
