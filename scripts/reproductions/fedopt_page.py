"""The fedopt reproduction's page: its text, tables and plot from the measured numbers."""

from __future__ import annotations

from typing import Any, Callable

from reproductions import trainer
from reproductions.page import Report

PAPER = ('Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan. *Adaptive Federated '
         'Optimization*, ICLR 2021 (Algorithm 2, Table 2, and their sweep of τ).')
CLAIM = """\
Replacing FedAvg's server step (the clients' mean) by an adaptive optimizer on the
pseudo-gradient, FedAdam or FedYogi (Algorithm 2: Adam's or Yogi's moments without bias
correction, v₋₁ = τ², step η·m/(√v + τ)), improves accuracy on heterogeneous clients, with
the client rate η_l and the server rate η tuned over a small grid of each. CIFAR-10 (500
clients, ResNet-18, 4,000 rounds; test accuracy %, the mean of the last 100 rounds): **FedAvg
72.8, FedAdam 77.4, FedYogi 78.0** (FedAvgM 77.4, FedAdagrad 72.1). The adaptivity τ matters
little as long as it is small: the accuracy is roughly flat for τ from 1e-4 to 1e-2 and falls
only for large τ, where the method turns into momentum SGD with a small rate."""


def _setting(quick: bool, plan: dict) -> str:
  size = ('`--quick`: digits, 20 clients, 4 rounds, one learning rate per method, no second '
          'seed and no τ sweep: a smoke test of the pipeline, whose numbers mean nothing.\n\n'
          if quick else '')
  grid = lambda m: (f'client {", ".join(f"{v:g}" for v in plan["client_lrs"][m])} × server '
                    f'{", ".join(f"{v:g}" for v in plan["server_lrs"][m])}')
  return size + f"""\
Theirs: CIFAR-10 over 500 clients of 100 images (Dirichlet label skew), 10 a round, a
ResNet-18 with group norm, one local epoch of SGD (batch 20), 4,000 rounds, η_l and η each
tuned over a grid of half-decades, β1 = 0.9, β2 = 0.99, τ = 1e-3, and a sweep of τ.

Ours: `federated.DigitsFedAvg` through the CLI (`python -m paxlike.main
--exp=federated.DigitsFedAvg --fdl_set=data.dataset={plan['dataset']} ...`) for FedAvg (server
SGD at lr 1), and the same experiment with FedAdam's / FedYogi's server
(`--exp=scripts.reproductions.fedopt_experiments.DigitsFedAdam` / `DigitsFedYogi`, which
change nothing but `ALGORITHM`; paxlike registers FedAdam and FedYogi only for its Shakespeare
LM): {plan['dataset']}, {plan['clients']} clients of equal size with Dirichlet(α =
{plan['alpha']:g}) label skew (`data.partition=dirichlet data.alpha={plan['alpha']:g}`;
paxlike draws each client's class mix from Dir(α·p), p the class frequencies, as Hsu et al.
2019 define it, so each of the 10 classes gets concentration 0.01: a client's largest class
holds 88% of its images on average on Fashion-MNIST), {plan['cohort']} clients a round drawn
uniformly, an MLP with hidden layers {plan['hidden']}, client SGD for {plan['local_steps']}
steps of batch {plan['batch']} ({plan['local_steps'] * plan['batch']} images a round per
client{plan.get('epoch', '')}), {plan['rounds']} rounds, eval on the whole test split every
{plan['eval_every']} rounds. A run's score is the mean accuracy of its last {plan['tail']} evals
(the last {plan['tail'] * plan['eval_every']} rounds). Grids (τ = 1e-3): FedAvg
{grid('fedavg')}; FedAdam {grid('fedadam')}; FedYogi {grid('fedyogi')}. The best point of
each is run again with `train.seed` = {', '.join(str(s) for s in plan['seeds'][1:]) or '–'}
(other initial weights and cohorts, the same partition); then FedAdam's and FedYogi's best are
run on every seed at τ ∈ {{{', '.join(f'{t:g}' for t in plan['taus'])}}}."""


def grid_table(plan: dict, grid: dict) -> tuple[str, list, list]:
  """Every grid point's score (seed 0), one row per (method, client lr)."""
  from reproductions.fedopt import LABELS
  servers = sorted({s for m in grid for s in plan['server_lrs'][m]})
  header = ['', 'client lr', *(f'server lr {s:g}' for s in servers)]
  rows = []
  for method, runs in grid.items():
    for c in plan['client_lrs'][method]:
      score = {r['server_lr']: r['accuracy'] for r in runs if r['client_lr'] == c}
      rows.append([LABELS[method], c, *(None if s not in score else f'{100 * score[s]:.1f}'
                                        for s in servers)])
  return (f'The grid: final accuracy % (mean of the last {plan["tail"]} evals), seed 0, '
          'τ = 1e-3.', header, rows)


def final_table(plan: dict, seeds: dict) -> tuple[str, list, list]:
  """Each method's best grid point on every seed, their mean, and the paper's number."""
  from reproductions.fedopt import LABELS, PAPER as PAPER_ACC, seed_mean
  header = ['', 'client lr', 'server lr', *(f'seed {s}' for s in plan['seeds']), 'mean',
            'paper (CIFAR-10)']
  rows = [[LABELS[m], runs[0]['client_lr'], runs[0]['server_lr'],
           *(f'{100 * r["accuracy"]:.1f}' for r in runs), f'{100 * seed_mean(runs):.1f}',
           PAPER_ACC[m]] for m, runs in seeds.items()]
  return ('The best of each grid: final accuracy % per seed (seed 0 chose the point).',
          header, rows)


def tau_table(plan: dict, taus: dict) -> tuple[str, list, list]:
  """τ at each method's best rates: every seed's score and their mean."""
  from reproductions.fedopt import LABELS, seed_mean
  header = ['', *(f'τ = {t:g}' for t in plan['taus'])]
  rows = [[LABELS[m], *(' / '.join(f'{100 * r["accuracy"]:.1f}' for r in by[t]) +
                        f' (mean {100 * seed_mean(by[t]):.1f})' for t in plan['taus'])]
          for m, by in taus.items()]
  return (f'τ at each method\'s best learning rates: final accuracy % on seeds '
          f'{" / ".join(str(s) for s in plan["seeds"])} (their mean).', header, rows)


def _plot(plan: dict, seeds: dict, taus: dict) -> Callable[[Any], None]:
  from reproductions.fedopt import KEY, LABELS, seed_mean

  def draw(figure) -> None:
    left, right = figure.subplots(1, 2)
    for method, runs in seeds.items():
      steps, acc = trainer.series(runs[0]['rows'], KEY)
      left.plot(steps, acc, label=f'{LABELS[method]} (η_l {runs[0]["client_lr"]:g}, '
                f'η {runs[0]["server_lr"]:g})')
    left.set(xlabel='round', ylabel='eval accuracy', title='best of each grid, seed 0')
    left.legend(fontsize=7)
    for method, by in taus.items():
      right.semilogx(list(by), [seed_mean(r) for r in by.values()], 'o-', label=LABELS[method])
    right.axhline(seed_mean(seeds['fedavg']), color='grey', linestyle=':',
                  label='FedAvg (best)')
    right.set(xlabel='τ', ylabel=f'final accuracy (last {plan["tail"]} evals)',
              title='adaptivity τ (mean of the seeds)')
    right.legend(fontsize=7)
  return draw


def report(quick: bool, plan: dict, grid: dict, best: dict, seeds: dict,
           taus: dict) -> Report:
  """The fedopt page's Report."""
  from reproductions.fedopt import LABELS, NAME, TITLE, seed_mean, verdict
  accuracy = {m: seed_mean(runs) for m, runs in seeds.items()}
  by_tau = {m: {t: seed_mean(r) for t, r in by.items()} for m, by in taus.items()}
  result, failed = verdict(accuracy, by_tau)
  summary = (', '.join(f'{LABELS[m]} {100 * a:.1f}%' for m, a in accuracy.items()) +
             f' (mean of {len(plan["seeds"])} seeds; paper, CIFAR-10: 72.8 / 77.4 / 78.0)' +
             (f'; failed: {"; ".join(failed)}' if failed else '') + '.')
  numbers = {'accuracy': accuracy, 'accuracy_by_tau': by_tau, 'failed': failed,
             'best': {m: {'client_lr': b['client_lr'], 'server_lr': b['server_lr']}
                      for m, b in best.items()}}
  tables = [final_table(plan, seeds), grid_table(plan, grid)]
  if len(plan['taus']) > 1:
    tables.append(tau_table(plan, taus))
  from reproductions.fedopt_why import why
  return Report(NAME, TITLE, PAPER, CLAIM, _setting(quick, plan), result, summary,
                why(plan, accuracy, by_tau, failed, seeds), tables, numbers,
                _plot(plan, seeds, taus))
