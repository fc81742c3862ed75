"""The papa reproduction's page: its text, tables and plot from the measured numbers."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from reproductions import trainer
from reproductions.page import Report

PAPER = ('Jolicoeur-Martineau, Gervais, Fatras, Zhang, Lacoste-Julien. *PopulAtion Parameter '
         'Averaging (PAPA)*, 2023 (arXiv:2304.03094; TMLR 2024).')
CLAIM = """\
Train a population of p networks in parallel, each from its own random init with its own
data order and augmentations, and every 10 SGD steps pull each one 1% toward the population's
average (w_j ← 0.99·w_j + 0.01·mean): the members stay different enough to learn different
things, yet close enough to be averaged, and at the end the population is averaged into
one network. That single network **beats the mean accuracy of the same networks trained
independently: +0.8 points on CIFAR-10 and +1.9 on CIFAR-100** (up to, over their
populations and architectures; +1.6 on ImageNet). Two cheaper variants average rarely:
PAPA-all replaces every member by the average every few epochs, PAPA-2 replaces the
population by averages of random pairs; both also beat independent training, a little less
than PAPA. Networks trained apart from different inits do not average well (their hidden
units are permuted against each other, so the mean of their weights is a poor network);
the gradual pull keeps the members close enough to be averaged. The issue asks PAPA's
average to be at least the uniform soup (the plain average) of independent members."""
LABELS = {'alone': 'members trained alone (mean)', 'soup': 'uniform soup of independents',
          'soup_same': 'uniform soup of independents, one init',
          'papa': 'PAPA (α = 0.99 every 10 steps)', 'papa_all': 'PAPA-all', 'papa_2': 'PAPA-2'}


def _setting(quick: bool, plan: dict) -> str:
  size = ('`--quick`: digits, populations of 2, 2 rounds per run: a smoke test of the '
          'pipeline, whose numbers mean nothing.\n\n' if quick else '')
  steps = plan['rounds'] * plan['local_steps']
  return size + f"""\
Theirs: CIFAR-10/100 (and ImageNet) with VGG/ResNet-18/ResNet-50, populations of 2–10, each
member from its own init with its own data order, augmentations and regularization (mixup,
CutMix, label smoothing drawn at random), 300 epochs on CIFAR; PAPA every 10 SGD steps at
α = 0.99, PAPA-all/PAPA-2 every 5 (or 10) epochs; the final population averaged (with REPAIR
for the soups).

Ours: `FashionMnistPapa` (scripts/reproductions/papa_experiments.py, paxlike's
`paxlike.configs.federated.papa` preset on `federated.DigitsFedAvg`'s MLP and SGD) through the CLI
(`python -m paxlike.main --exp=scripts.reproductions.papa_experiments.FashionMnistPapa
--fdl_set=data.dataset={plan['dataset']} ...`): a population of {plan['population']} ReLU
MLPs with hidden layers {plan['hidden']}, each from its own random init (paxlike's
`seeded_init`, member j from (seed, j)) and each round drawing a new one of
{plan['clients']} IID clients of the training set (so each sees all of it in its own order;
no augmentation), {plan['local_steps']} SGD steps of batch {plan['batch']} at lr
{plan['lr']:g} a round, {plan['rounds']} rounds = {steps:,} SGD steps per member
({steps * plan['batch'] / 60000:.1f} epochs of Fashion-MNIST's 60,000). PAPA: α =
{plan['alpha']:g} every round ({plan['local_steps']} SGD steps; the paper's period is 10);
PAPA-all and PAPA-2 every
{plan['every_all']} rounds ({plan['every_all'] * plan['local_steps']} steps,
{plan['every_all'] * plan['local_steps'] * plan['batch'] / 60000:.2f} epochs: about
{plan['rounds'] // plan['every_all']} averagings, where the paper's 300 epochs hold 60; as
often, for these short runs, would leave 10 steps between averagings).
Independent members: the same runs with a population of 1 (`algorithm.population=1`), one per
member; their soup: the population run with α = 1 (never pulled), whose evaluated params are
the population's mean, from own inits and from one shared init (`algorithm.same_init=True`).
Every number is the final eval on the whole test split (10,000 images), seeds
{', '.join(map(str, plan['seeds']))} (the seed moves the inits and the data orders)."""


def _accs(results: dict, method: str, group: int) -> list[float]:
  return [r['accuracy'] for r in results[(method, group)]]


def summary_table(plan: dict, results: dict, m: dict) -> tuple[str, list, list]:
  header = ['method', *[f'seed {g}' for g in plan['seeds']], 'mean', 'vs alone', 'paper']
  paper = {'papa': '+0.8 (C10), +1.9 (C100)', 'papa_all': 'above alone',
           'papa_2': 'above alone'}
  rows = []
  for method in m:
    per_seed = [np.mean(_accs(results, method, g)) for g in plan['seeds']]
    rows.append([LABELS[method], *(f'{a:.2f}' for a in per_seed), f'{m[method]:.2f}',
                 '–' if method == 'alone' else f"{m[method] - m['alone']:+.2f}",
                 paper.get(method, '–')])
  return ('Test accuracy (%) of the final network: each population\'s average (the soup of its '
          'members), and the mean of the members trained alone.', header, rows)


def members_table(plan: dict, results: dict) -> tuple[str, list, list]:
  header = ['seed', *[f'member {j}' for j in range(plan['alone'])], 'mean', 'spread']
  rows = []
  for g in plan['seeds']:
    accs = _accs(results, 'alone', g)
    rows.append([g, *(f'{a:.2f}' for a in accs), f'{np.mean(accs):.2f}',
                 f'{max(accs) - min(accs):.2f}'])
  return ('Members trained alone (a population of 1 each): test accuracy (%).', header, rows)


def _plot(plan: dict, results: dict, m: dict) -> Callable[[Any], None]:
  from reproductions.papa import KEY

  def draw(figure) -> None:
    left, right = figure.subplots(1, 2)
    group = plan['seeds'][0]
    for method in m:
      rows = results[(method, group)][0]['rows']
      steps, acc = trainer.series(rows, KEY)
      label = LABELS[method] if method != 'alone' else 'member 0 trained alone'
      left.plot(steps, [100 * a for a in acc], label=label, marker='.')
    left.set(xlabel=f"round ({plan['local_steps']} SGD steps per member)",
             ylabel='test accuracy (%)', title=f'seed {group}',
             ylim=(max(0, m['alone'] - 15), min(100, m['alone'] + 5)))
    left.legend(fontsize=7)
    names = list(m)
    gains = [m[k] - m['alone'] for k in names]
    bottom = max(-5, min(gains) - 0.5)
    right.bar(range(len(names)), gains)
    for i, gain in enumerate(gains[1:], 1):  # The value, also of a bar cut off at the bottom.
      right.annotate(f'{gain:+.2f}', (i, max(gain, bottom)), ha='center', fontsize=7,
                     va='bottom' if gain >= 0 else 'top' if gain > bottom else 'bottom')
    right.axhline(0, color='k', lw=0.5)
    right.set_xticks(range(len(names)), [LABELS[k].split(' (')[0] for k in names], rotation=30,
                     ha='right', fontsize=7)
    right.set(ylabel='points over the members trained alone',
              title='final accuracy, mean over seeds',
              ylim=(bottom, max(gains) + 0.5))
  return draw


def report(quick: bool, plan: dict, results: dict) -> Report:
  """The papa page's Report."""
  from reproductions.papa import NAME, TITLE, means, verdict
  from reproductions.papa_why import why
  m = means(plan, results)
  result, failed = verdict(m['alone'], [m[k] for k in plan['soups']], m['papa'], m['papa_all'],
                           m['papa_2'])
  gain = lambda k: f"{m[k] - m['alone']:+.2f}"
  line = (f"PAPA's average {m['papa']:.2f}% vs the members trained alone {m['alone']:.2f}% "
          f"({gain('papa')} points; the paper: +0.8 CIFAR-10, +1.9 CIFAR-100); PAPA-all "
          f"{gain('papa_all')}, PAPA-2 {gain('papa_2')}; the uniform soup of independent members "
          f"{m['soup']:.2f}% (own inits)"
          + (f", {m['soup_same']:.2f}% (one init)" if 'soup_same' in m else ''))
  summary_line = line + (f' (failed: {"; ".join(failed)})' if failed else '') + '.'
  numbers = {**{k: round(v, 3) for k, v in m.items()},
             'gain': round(m['papa'] - m['alone'], 3), 'failed': failed}
  tables = [summary_table(plan, results, m), members_table(plan, results)]
  return Report(NAME, TITLE, PAPER, CLAIM, _setting(quick, plan), result, summary_line,
                why(plan, results, m, failed), tables, numbers, _plot(plan, results, m))
