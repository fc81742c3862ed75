"""tests.helpers.metric_rows: which fields a determinism comparison skips, named one by one."""

import json

from paxlike.trainer import throughput
from tests.helpers import TIMING_FIELDS, metric_rows


def test_only_the_listed_timing_fields_are_dropped_and_unknown_fields_are_compared(tmp_path):
  # Names that contain a timing marker as a substring ('eta' in 'beta', 'time' in 'lifetime')
  # but are not timing fields: they must stay in the comparison.
  kept = {'step': 3, 'loss': 2.5, 'beta': 0.9, 'eval_theta': 1.0, 'lifetime_clients': 7}
  row = {**kept, **{name: 1.0 for name in TIMING_FIELDS}}
  (tmp_path / 'metrics.jsonl').write_text(json.dumps(row) + '\n')
  assert metric_rows(tmp_path) == [kept]
  assert metric_rows(tmp_path, timing=True) == [row]


def test_the_list_is_every_timing_field_the_trainer_writes():
  # train.train's own rate and data wait; the rest come from throughput_metrics.
  written = {'steps_per_sec', 'data_wait_time_fraction'}
  for item in ('tokens', 'examples'):
    written |= set(throughput.throughput_metrics(2.0, 64, item, flops_per_device=1e9,
                                                 num_devices=1, peak_per_device=1e12))
  assert written == TIMING_FIELDS
  # The job dir contract's naming rule (DESIGN.md): a timing field's name says so.
  assert all(any(mark in name for mark in ('per_sec', 'time', 'mfu', 'flops', 'eta'))
             for name in TIMING_FIELDS)
