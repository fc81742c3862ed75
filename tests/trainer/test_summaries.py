"""The run writer on resume: rows after the restored step and torn rows are dropped."""

import json

from paxlike.trainer.summaries import RunWriter


def test_resume_drops_torn_rows_of_both_jsonl_files_and_says_so_once_each(tmp_path, capsys):
  rows = [json.dumps({'step': s, 'loss': 1.0 / s}) for s in (5, 10, 15)]
  tables = [json.dumps({'step': s, 'clients': {'0': {'loss': 1.0}}}) for s in (10, 20)]
  (tmp_path / 'metrics.jsonl').write_text('\n'.join(rows) + '\n' + rows[2][:9])
  (tmp_path / 'eval_clients.jsonl').write_text('\n'.join(tables) + '\n' + tables[1][:20])
  RunWriter(tmp_path, 10, 20).close()
  assert (tmp_path / 'metrics.jsonl').read_text() == rows[0] + '\n' + rows[1] + '\n'
  assert (tmp_path / 'eval_clients.jsonl').read_text() == tables[0] + '\n'
  assert capsys.readouterr().err == ('dropped 1 torn line of metrics.jsonl, cut short by a crash\n'
                                     'dropped 1 torn line of eval_clients.jsonl, cut short by a crash\n')
  RunWriter(tmp_path, 10, 20).close()  # Nothing torn left: nothing said.
  assert capsys.readouterr().err == ''
