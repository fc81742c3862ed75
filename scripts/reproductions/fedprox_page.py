"""The fedprox reproduction's page: its text, tables and plot from the measured numbers."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from reproductions import trainer
from reproductions.page import Report

PAPER = ('Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith. *Federated Optimization in '
         'Heterogeneous Networks*, MLSys 2020.')
CLAIM = """\
Under systems heterogeneity, where most devices of a round are stragglers that manage fewer
local epochs than E = 20, FedAvg drops the stragglers and FedProx keeps their partial work
and adds a proximal term μ/2‖w − wᵗ‖² to each local objective. With **90% stragglers**,
FedProx with its best μ from {0.001, 0.01, 0.1, 1} converges more stably and to a better
model: **+22 points of absolute test accuracy on average** over their data sets (synthetic,
MNIST, FEMNIST, Sent140, Shakespeare; 10 devices a round). Keeping the partial work alone
(FedProx μ = 0) already helps; the proximal term adds stability on heterogeneous data. On
IID data the methods behave alike."""
LABELS = {'shards': 'non-IID (2 label-sorted shards per client)', 'iid': 'IID'}


def _setting(quick: bool, plan: dict) -> str:
  size = ('`--quick`: digits, 20 clients, 2 rounds per run, one μ: a smoke test of the '
          'pipeline, whose numbers mean nothing.\n\n' if quick else '')
  return size + f"""\
Theirs: MNIST (1,000 devices, 2 digits each), FEMNIST, Sent140, Shakespeare and synthetic
data; multinomial logistic regression for MNIST; 10 devices a round, E = 20 local epochs of
batch 10; 0%, 50% or 90% stragglers, each running a uniformly random number of local epochs
in [1, E); μ the best of {{0.001, 0.01, 0.1, 1}} per data set.

Ours: `federated.DigitsFedAvg` through the CLI with overrides (`python -m paxlike.main
--exp=federated.DigitsFedAvg --fdl_set=data.dataset={plan['dataset']}
--fdl_set=data.straggler_fraction={plan['stragglers']} ...`): {plan['dataset']},
{plan['clients']} clients of equal size, 2 label-sorted shards each (`data.partition=shards`)
or an IID share, {plan['cohort']} a round drawn uniformly, softmax regression
(`model.hidden=()`), {plan['local_steps']} local SGD steps of batch {plan['batch']}, server SGD
at lr 1; {100 * plan['stragglers']:g}% stragglers (`data.straggler_fraction`: each client of
a round independently, a uniform 1 to {plan['local_steps'] - 1} of its local steps). FedAvg
drops them (weight 0, the default at μ = 0); FedProx (`algorithm.prox_mu`) keeps them, and
so does FedProx μ = 0 (`algorithm.drop_stragglers=False`). Client lr {plan['lr']:g} for
FedProx; FedAvg's the best of {', '.join(f'{lr:g}' for lr in plan['fedavg_lrs'])};
μ ∈ {{{', '.join(f'{mu:g}' for mu in plan['mus'])}}}. {plan['rounds']} rounds, eval on the
whole test split every {plan['eval_every']}; a run's accuracy is the mean of its last
{plan['tail']} evals, averaged over seeds {', '.join(map(str, plan['seeds']))} (the seed
moves the init, the cohorts and who straggles)."""


def _pct(value: float | None) -> str:
  return '–' if value is None else f'{100 * value:.1f}'


def grid_table(plan: dict, results: dict, partition: str) -> tuple[str, list, list]:
  """Every run of a partition: its final accuracy per seed and their mean."""
  header = ['method', 'client lr', 'μ', *[f'seed {s}' for s in plan['seeds']], 'mean']
  rows = []
  keys = [('fedavg', lr) for lr in plan['fedavg_lrs']]
  keys += [('fedprox', mu) for mu in (0.0, *plan['mus']) if (partition, 'fedprox', mu) in results]
  for method, k in keys:
    runs = results[(partition, method, k)]
    accs = [r['accuracy'] for r in runs]
    label = 'FedAvg (drops stragglers)' if method == 'fedavg' else 'FedProx (keeps them)'
    rows.append([label, k if method == 'fedavg' else plan['lr'],
                 '–' if method == 'fedavg' else k, *map(_pct, accs), _pct(np.mean(accs))])
  return (f'{LABELS[partition]}: test accuracy (%), mean of the last {plan["tail"]} evals, '
          'each run.', header, rows)


def drift_table(plan: dict, results: dict) -> tuple[str, list, list]:
  """FedProx with more local work (the plan's `drift`), non-IID: accuracy and swing per μ."""
  from reproductions.fedprox_why import swing
  drift = plan['drift']
  header = ['μ', *[f'seed {s}' for s in plan['seeds']], 'mean', 'swing (points)']
  rows = []
  for mu in drift['mus']:
    accs = [r['accuracy'] for r in results[('shards', 'drift', mu)]]
    rows.append([mu, *map(_pct, accs), _pct(np.mean(accs)),
                 f"{swing(results, ('shards', 'drift', mu)):.1f}"])
  return (f"More local work, non-IID: FedProx (keeping stragglers' work) with "
          f"{drift['local_steps']} local steps at client lr {drift['lr']:g} (5× the steps at 4× "
          'the rate), test accuracy (%) as above; swing: the mean |change| between '
          'consecutive evals over the second half of the run.', header, rows)


def summary_table(summaries: dict) -> tuple[str, list, list]:
  header = ['data', 'FedAvg', 'FedProx μ = 0', 'FedProx best μ', 'gain (points)',
            'paper: gain']
  rows = [[LABELS[p], f"{_pct(s['fedavg'])} (lr {s['fedavg_lr']:g})", _pct(s['fedprox_mu0']),
           f"{_pct(s['fedprox'])} (μ {s['mu']:g})", f"{s['gain']:+.1f}",
           '+22 on average' if p == 'shards' else 'small']
          for p, s in summaries.items()]
  return ('With 90% stragglers: test accuracy (%) of the best of each method, and FedProx\'s '
          'best μ minus FedAvg.', header, rows)


def _curves(plan: dict, results: dict, partition: str, s: dict) -> list[tuple[str, list]]:
  pick = lambda key: results[(partition, *key)][0]['rows']  # The first seed's run.
  return [(f"FedAvg, drops (lr {s['fedavg_lr']:g})", pick(('fedavg', s['fedavg_lr']))),
          *([('FedProx μ = 0, keeps', pick(('fedprox', 0.0)))]
            if (partition, 'fedprox', 0.0) in results else []),
          (f"FedProx μ = {s['mu']:g}, keeps", pick(('fedprox', s['mu'])))]


def _plot(plan: dict, results: dict, summaries: dict) -> Callable[[Any], None]:
  from reproductions.fedprox import KEY, PARTITIONS

  def draw(figure) -> None:
    for ax, partition in zip(figure.subplots(1, 2, sharey=True), PARTITIONS):
      for label, rows in _curves(plan, results, partition, summaries[partition]):
        steps, acc = trainer.series(rows, KEY)
        ax.plot(steps, acc, label=label, marker='.')
      ax.set(xlabel='round', ylabel='test accuracy', ylim=(0, 1),
             title=f'{LABELS[partition]}, 90% stragglers, seed {plan["seeds"][0]}')
      ax.legend(fontsize=7)
  return draw


def report(quick: bool, plan: dict, results: dict) -> Report:
  """The fedprox page's Report."""
  from reproductions.fedprox import NAME, PARTITIONS, TITLE, summary, verdict
  from reproductions.fedprox_why import why
  summaries = {p: summary(plan, results, p) for p in PARTITIONS}
  non_iid, iid = summaries['shards'], summaries['iid']
  result, failed = verdict(non_iid['gain'], iid['gain'])
  line = (f"non-IID: FedProx (μ {non_iid['mu']:g}) {_pct(non_iid['fedprox'])}% vs FedAvg "
          f"{_pct(non_iid['fedavg'])}% ({non_iid['gain']:+.1f} points; the paper: +22 on "
          f"average); IID: {_pct(iid['fedprox'])}% vs {_pct(iid['fedavg'])}% "
          f"({iid['gain']:+.1f})")
  summary_line = line + (f' (failed: {"; ".join(failed)})' if failed else '') + '.'
  numbers = {'non_iid': {k: round(v, 4) if isinstance(v, float) else v
                         for k, v in non_iid.items()},
             'iid': {k: round(v, 4) if isinstance(v, float) else v for k, v in iid.items()},
             'failed': failed}
  tables = [summary_table(summaries), *(grid_table(plan, results, p) for p in PARTITIONS),
            *([drift_table(plan, results)] if plan['drift'] else [])]
  return Report(NAME, TITLE, PAPER, CLAIM, _setting(quick, plan), result, summary_line,
                why(plan, results, summaries, failed), tables, numbers,
                _plot(plan, results, summaries))
