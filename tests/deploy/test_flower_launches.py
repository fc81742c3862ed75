"""The launcher's reading of Flower's record of its runs (`launches.server_app_failure` on
runs.json, what `flwr ls --format json` prints): the reason the latest failed ServerApp gave,
on one line, for the launcher's failure line."""

from __future__ import annotations

import json

from paxlike.deploy.flower import launches


def _runs(path, *runs: dict) -> None:
  path.write_text(json.dumps({'success': True, 'runs': list(runs)}))


def test_the_latest_failed_runs_reason_on_one_line(tmp_path):
  runs = tmp_path / 'runs.json'
  _runs(runs,
        {'run-id': '7', 'status': 'finished:failed', 'finished-at': '2026-12-07 10:00:01Z',
         'status-details': 'ServerApp failed with exception: an older one'},
        {'run-id': '3', 'status': 'finished:failed', 'finished-at': '2026-12-07 10:02:00Z',
         'status-details': 'ServerApp failed with exception: round 2: 2 of the nodes\n left'},
        {'run-id': '9', 'status': 'finished:stopped', 'finished-at': '2026-12-07 10:03:00Z',
         'status-details': 'stopped by the user'})
  assert launches.server_app_failure(runs) == (
      'ServerApp failed with exception: round 2: 2 of the nodes left')


def test_no_failed_run_or_no_record_gives_none(tmp_path):
  runs = tmp_path / 'runs.json'
  assert launches.server_app_failure(runs) is None  # Not written.
  runs.write_text('not json')
  assert launches.server_app_failure(runs) is None
  _runs(runs, {'run-id': '1', 'status': 'finished:completed', 'status-details': ''},
        {'run-id': '2', 'status': 'finished:failed', 'status-details': ''})
  assert launches.server_app_failure(runs) is None
