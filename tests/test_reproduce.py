"""scripts/reproduce.py: each reproduction's `--quick` run trains through the CLI, prints one JSON
line and writes a page with every section and its plot; each verdict function decides the
paper's claim right on numbers made up here (the papers' own, and ones that break each
condition); the dp reproduction's accountant equals dp_accounting called directly."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO, cli_env, run_python

sys.path.insert(0, str(REPO / 'scripts'))

from reproductions import NAMES, dp, fedavg, page, scaffold, trainer  # noqa: E402

PNG = b'\x89PNG\r\n\x1a\n'


# `python scripts/reproduce.py ARGS`, forked from the worker's fork server, with its training
# runs forked from it in turn (tests/forked_cli.py) instead of each importing paxlike again (nor
# what the reproduction's runs import besides: reproduce.preload).
REPRODUCE = """
import sys
sys.path.insert(0, 'scripts')
import cli_runs, reproduce
from tests.forked_cli import ForkServer
reproduce.preload({args!r})
cli_runs.START = ForkServer.here().popen
sys.exit(reproduce.main({args!r}))
"""


def reproduce(*args: str) -> subprocess.CompletedProcess:
  return run_python(['-c', REPRODUCE.format(args=list(args))], cli_env(1), timeout=900)


def test_list_names_every_reproduction():
  proc = reproduce('--list')
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert [line.split('\t')[0] for line in proc.stdout.splitlines()] == list(NAMES)


@pytest.mark.slow
@pytest.mark.parametrize('name', NAMES)
def test_quick_run_prints_its_verdict_and_writes_its_page(name, tmp_path):
  proc = reproduce(name, '--quick', f'--out={tmp_path / "out"}', f'--work={tmp_path / "jobs"}')
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.strip().splitlines()
  assert len(lines) == 1, proc.stdout
  result = json.loads(lines[0])
  assert result['reproduction'] == name and result['quick'] is True
  assert result['verdict'] in page.VERDICTS
  text = (tmp_path / 'out' / f'{name}.md').read_text()
  assert result['page'] == str(tmp_path / 'out' / f'{name}.md')
  positions = [text.index(section) for section in page.SECTIONS]
  assert positions == sorted(positions)  # Every section, in order.
  verdict_line = text[positions[0]:positions[1]]
  assert f'**{result["verdict"]}**' in verdict_line
  assert f'python scripts/reproduce.py {name} --quick' in text and f'![{name}]({name}.png)' in text
  assert text.count('|---|') >= 1  # At least one markdown table.
  assert (tmp_path / 'out' / f'{name}.png').read_bytes().startswith(PNG)
  # Real training: every run left its job dir with metrics rows.
  jobs = [p for p in (tmp_path / 'jobs').iterdir() if p.is_dir()]
  assert jobs and all(trainer.read_rows(j / 'metrics.jsonl') for j in jobs)
  # --reuse redoes the page from those runs, training nothing: the same verdict and numbers.
  again = reproduce(name, '--quick', f'--out={tmp_path / "again"}', f'--work={tmp_path / "jobs"}',
                    '--reuse')
  assert again.returncode == 0, again.stderr[-3000:]
  assert 'training' not in again.stderr
  redone = json.loads(again.stdout)
  skip = {'page', 'plot', 'seconds'}
  assert {k: v for k, v in redone.items() if k not in skip} == {
      k: v for k, v in result.items() if k not in skip}
  assert sorted(p.name for p in (tmp_path / 'jobs').iterdir() if p.is_dir()) == sorted(
      j.name for j in jobs)


def test_quick_run_never_replaces_a_committed_page(tmp_path):
  """Without --out a quick run writes to a new temp dir, a full one to docs/reproductions."""
  import reproduce as cli  # scripts/reproduce.py
  quick = cli.out_dir(cli.parse(['dp', '--quick']))
  assert quick.is_dir() and not any(quick.iterdir())
  assert REPO / 'docs' not in quick.parents
  assert cli.out_dir(cli.parse(['dp'])) == REPO / 'docs' / 'reproductions'
  assert cli.out_dir(cli.parse(['dp', '--quick', f'--out={tmp_path}'])) == tmp_path


# fedavg: the paper's CNN column of Table 2 (rounds), and numbers that break one condition each.
IID = {(1, None): 626, (1, 50): 65, (1, 10): 34, (5, 10): 20}
NON_IID = {(1, None): 483, (1, 50): 600, (1, 10): 350, (5, 10): 229}
U = {(1, 50): 12, (1, 10): 60, (5, 10): 300}


def speedup_pairs(rounds: dict) -> list[tuple[int, float | None]]:
  base = rounds[(1, None)]
  return [(U[k], None if r is None else base / r) for k, r in rounds.items() if k in U]


def test_fedavg_verdict_on_the_papers_numbers_is_reproduced():
  iid = speedup_pairs(IID)
  assert iid == [(12, 626 / 65), (60, 626 / 34), (300, 626 / 20)]
  assert fedavg.verdict(iid, iid, speedup_pairs(NON_IID)) == ('reproduced', [])


@pytest.mark.parametrize('iid, non_iid, result, failed', [
    ({**IID, (1, 10): 80}, NON_IID, 'partly', 'grows with the updates'),  # 7.8× < 9.6×.
    ({**IID, (5, 10): None}, NON_IID, 'partly', 'grows with the updates'),  # Never reached.
    (IID, {**NON_IID, (5, 10): 500, (1, 10): 490}, 'partly', 'above 1×'),  # 0.97× best.
    (IID, {k: v // 10 for k, v in IID.items()}, 'partly', 'far below'),  # As fast as IID.
    ({k: v if k == (1, None) else 100 for k, v in IID.items()}, NON_IID, 'not', '10×'),
])
def test_fedavg_verdict_names_the_broken_condition(iid, non_iid, result, failed):
  got, reasons = fedavg.verdict(speedup_pairs(iid), speedup_pairs(iid), speedup_pairs(non_iid))
  assert got == result and len(reasons) == 1 and failed in reasons[0]


def test_fedavg_speedups_count_an_unreached_fedsgd_as_its_cap():
  caps = {(1, None): 800, (1, 10): 100}
  assert fedavg.speedups({(1, None): 400, (1, 10): None}, caps) == {(1, None): 1.0, (1, 10): None}
  assert fedavg.speedups({(1, None): None, (1, 10): 50}, caps) == {(1, None): None,
                                                                   (1, 10): 16.0}
  assert fedavg.updates(5, 10, 600) == 300 and fedavg.updates(1, None, 600) == 1


# scaffold: Table 3's 0% column (epochs 1 and 10) plus a 100% column where both beat SGD.
TABLE3 = {('sgd', 1, 0): 317, ('fedavg', 1, 0): 258, ('fedavg', 10, 0): 711,
          ('scaffold', 1, 0): 77, ('scaffold', 10, 0): 286, ('sgd', 1, 100): 400,
          ('fedavg', 1, 100): 80, ('fedavg', 10, 100): 20, ('scaffold', 1, 100): 60,
          ('scaffold', 10, 100): 15}


@pytest.mark.parametrize('change, result, failed', [
    ({}, 'reproduced', None),
    ({('fedavg', 10, 0): 200}, 'partly', 'more rounds with more epochs'),
    ({('fedavg', 10, 0): None}, 'reproduced', None),  # Never reaching it is slower still.
    ({('scaffold', 10, 0): 350}, 'partly', 'SCAFFOLD beats SGD'),
    ({('scaffold', 1, 0): None}, 'partly', 'SCAFFOLD beats SGD'),
    ({('fedavg', 1, 100): 500}, 'partly', '100% similarity'),
    ({('fedavg', 10, 0): 100, ('scaffold', 1, 0): 400, ('fedavg', 1, 100): 500}, 'not', None),
])
def test_scaffold_verdict_follows_table3s_shape(change, result, failed):
  got, reasons = scaffold.verdict({**TABLE3, **change}, (1, 10))
  assert got == result
  if failed:
    assert len(reasons) == 1 and failed in reasons[0]


# A 10% column of the paper's shape (FedAvg and SCAFFOLD beat SGD; made-up numbers).
TABLE3_10 = {('sgd', 1, 10): 317, ('fedavg', 1, 10): 82, ('fedavg', 10, 10): 97,
             ('scaffold', 1, 10): 42, ('scaffold', 10, 10): 14}


def test_scaffold_verdict_asks_10_percent_similarity_too_where_it_ran():
  assert scaffold.verdict({**TABLE3, **TABLE3_10}, (1, 10)) == ('reproduced', [])
  got, reasons = scaffold.verdict({**TABLE3, **TABLE3_10, ('fedavg', 10, 10): None}, (1, 10))
  assert got == 'partly' and reasons == [
      'at 10% and 100% similarity FedAvg and SCAFFOLD beat SGD']


@pytest.mark.parametrize('costs, result', [
    ([(25, 0.30), (100, 0.08), (400, 0.01)], 'reproduced'),
    ([(25, 0.30), (100, 0.305), (400, 0.10)], 'reproduced'),  # A rise within the eval's noise.
    ([(25, 0.30), (100, 0.35), (400, 0.10)], 'partly'),  # A real rise on the way.
    ([(25, 0.30), (100, 0.20), (400, 0.20)], 'partly'),  # Lower, but not half.
    ([(25, 0.10), (100, 0.05), (400, 0.10)], 'not'),
])
def test_dp_cohort_verdict(costs, result):
  assert dp.cohort_verdict(costs) == result


def test_dp_clip_and_overall_verdicts():
  fixed = {0.1: 0.70, 0.3: 0.80, 1.0: 0.78}
  assert dp.clip_verdict(0.795, fixed) == 'reproduced'
  assert dp.clip_verdict(0.85, fixed) == 'reproduced'
  assert dp.clip_verdict(0.78, fixed) == 'partly'
  assert dp.clip_verdict(0.75, fixed) == 'not'
  assert dp.overall(['reproduced'] * 3) == 'reproduced'
  assert dp.overall(['reproduced', 'not', 'partly']) == 'partly'
  assert dp.overall(['not'] * 3) == 'not'


def test_dp_accountant_is_dp_accountings_and_matches_table1():
  import dp_accounting
  rows = dp.paper_accountant([1, 100_000], pld=False)
  delta = (10**5)**-1.1
  for r, paper, poisson, uniform in rows:
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dp_accounting.PoissonSampledDpEvent(1e-3, dp_accounting.GaussianDpEvent(1.0)), r)
    assert poisson == pytest.approx(rdp.get_epsilon(delta), rel=1e-9)
    assert abs(poisson - paper) <= 0.01 and uniform > 3 * poisson
  ours = {r: poisson for r, _, poisson, _ in rows}
  assert dp.accountant_matches(ours, dp.PAPER_TABLE1['epsilon'])
  assert not dp.accountant_matches({1: 0.70, 100_000: 1.95}, dp.PAPER_TABLE1['epsilon'])


def test_trainer_picks_the_run_first_to_the_highest_target():
  rows = [{'step': 1, 'acc': 0.2}, {'step': 2}, {'step': 3, 'acc': 0.6}, {'step': 4, 'acc': 0.9}]
  assert trainer.rounds_to(rows, 'acc', [0.5, 0.8, 0.95]) == {0.5: 3, 0.8: 4, 0.95: None}
  slow_high = {'name': 'a', 'rounds': {0.5: 30, 0.8: 90}}
  fast_low = {'name': 'b', 'rounds': {0.5: 5, 0.8: None}}
  fast_high = {'name': 'c', 'rounds': {0.5: 40, 0.8: 60}}
  assert trainer.fastest([fast_low, slow_high, fast_high], [0.5, 0.8])['name'] == 'c'
  assert trainer.fastest([fast_low, {'name': 'd', 'rounds': {0.5: 9, 0.8: None}}],
                         [0.5, 0.8])['name'] == 'b'
