"""A training process's anonymous memory does not grow with the token store: RssAnon of a
process iterating TextData batches over a 2 GB store is within 100 MB of one over a 20 MB store
(measured by benchmarks/data_pipeline.py in a child process)."""

import pytest

from tests.data.test_text_benchmark import run_json


@pytest.mark.slow
def test_rss_anon_on_a_2gb_store_is_within_100mb_of_a_20mb_store():
  rss = run_json('--only', 'rss', '--rss_mb', '20,2000', timeout=600)['rss']
  assert rss['20']['store_mb'] == 20 and rss['2000']['store_mb'] == 2000
  assert abs(rss['difference_mb']) < 100, rss
