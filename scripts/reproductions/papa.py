"""papa: the population's average vs independently trained members (Jolicoeur-Martineau et al.
2023, PopulAtion Parameter Averaging).

Every run is `FashionMnistPapa` (scripts/reproductions/papa_experiments.py: PAPA over MLPs with
client SGD on Fashion-MNIST, paxlike.federated.papa) through the CLI with `--fdl_set`
overrides. Each member draws a new IID client (a thousandth-ish of the training set) every
round, so every member sees the whole training set in its own order, from its own random init
(the paper's sources of diversity, less their augmentations). The runs, per seed:
- `alone`: a population of 1, once per member (own init, own data order): the mean of their
  accuracies is the paper's baseline, independently trained members;
- `soup`: the population with α = 1 (never pulled): its evaluated params, the population mean,
  are the uniform soup of independent members; `soup_same`: the same from one shared init
  (`algorithm.same_init=True`), where a soup of independent models can work;
- `papa`: w_j ← α·w_j + (1 − α)·mean every round of 10 SGD steps (the paper's default);
- `papa_all` / `papa_2`: every member replaced by the mean / by the mean of a random pair,
  every `plan['every_all']` rounds (the paper: every few epochs).
A run's accuracy is its final eval on the whole test split (the population mean's, as the
paper averages the population into one network at the end).
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Sequence

from reproductions import trainer
from reproductions.page import Report

NAME, TITLE = 'papa', 'PAPA: the population average vs independently trained members'
EXP = 'scripts.reproductions.papa_experiments.FashionMnistPapa'
KEY = 'eval_accuracy'
METHODS = ('alone', 'soup', 'soup_same', 'papa', 'papa_all', 'papa_2')
FULL = dict(dataset='fashion_mnist', clients=60, population=4, local_steps=10, batch=32,
            hidden='(128,)', lr=0.1, rounds=1000, eval_every=50, alpha=0.99, every_all=100,
            seeds=(0, 1), alone=4, soups=('soup', 'soup_same'), workers=2)
QUICK = dict(dataset='digits', clients=20, population=2, local_steps=2, batch=16,
             hidden='(32,)', lr=0.1, rounds=2, eval_every=2, alpha=0.99, every_all=1,
             seeds=(0,), alone=1, soups=('soup',), workers=2)
# The paper's headline (Table 1 and abstract): PAPA's average over independent members, points.
PAPER_GAIN = {'CIFAR-10': 0.8, 'CIFAR-100': 1.9}
MIN_GAIN = 0.4  # Points PAPA must gain over the members' mean (half the paper's CIFAR-10 gain).
TIE = 0.2       # Points within which PAPA counts as "at least" a soup (the evals' noise).


def final_accuracy(rows: Sequence[dict]) -> float:
  """The accuracy of the run's last eval, in points."""
  _, values = trainer.series(rows, KEY)
  if not values:
    raise ValueError('the run logged no eval accuracy')
  return 100 * values[-1]


def verdict(alone: float, soups: Sequence[float], papa: float, papa_all: float,
            papa_2: float) -> tuple[str, list[str]]:
  """(verdict, failed conditions) from mean accuracies in points: the members trained alone,
  the uniform soups of independent members, PAPA's, PAPA-all's and PAPA-2's population
  average. Reproduced: PAPA beats the members by at least MIN_GAIN points, is at least every
  soup (within TIE), and PAPA-all and PAPA-2 beat the members too. Not: PAPA does not beat the
  members. Else partly."""
  if not papa > alone:
    return 'not', ['PAPA\'s average beats the mean of the independently trained members']
  failed = []
  if papa - alone < MIN_GAIN:
    failed.append(f'PAPA gains at least {MIN_GAIN:g} points over the members\' mean')
  if any(papa < soup - TIE for soup in soups):
    failed.append('PAPA is at least the uniform soup of independent members')
  for label, value in (('PAPA-all', papa_all), ('PAPA-2', papa_2)):
    if not value > alone:
      failed.append(f'{label} beats the members\' mean')
  return ('reproduced' if not failed else 'partly'), failed


def _overrides(plan: dict, method: str, seed: int) -> dict:
  """The CLI overrides of one run of `method` (a population of 1 for 'alone')."""
  population = 1 if method == 'alone' else plan['population']
  algorithm = {'soup': dict(alpha=1.0), 'soup_same': dict(alpha=1.0, same_init=True),
               'papa': dict(alpha=plan['alpha'], every=1),
               'papa_all': dict(variant='all', every=plan['every_all']),
               'papa_2': dict(variant='pairs', every=plan['every_all'])}.get(method, {})
  return {'data.dataset': plan['dataset'], 'data.num_clients': plan['clients'],
          'data.partition': 'iid', 'data.clients_per_round': population,
          'algorithm.population': population,
          **{f'algorithm.{k}': v for k, v in algorithm.items()},
          'data.local_steps': plan['local_steps'], 'data.batch_size': plan['batch'],
          'data.num_eval_batches': None, 'model.hidden': plan['hidden'],
          'optimizer.learning_rate': plan['lr'], 'train.seed': seed,
          'train.num_steps': plan['rounds'], 'train.eval_every': plan['eval_every'],
          'train.log_every': plan['eval_every'], 'train.checkpoint_every': 100_000}


def methods(plan: dict) -> tuple[str, ...]:
  """The methods a plan runs: all but the soups it leaves out (`--quick`: one soup)."""
  return tuple(m for m in METHODS if not m.startswith('soup') or m in plan['soups'])


def runs(plan: dict) -> list[tuple[str, str, int, int]]:
  """(name, method, seed group, train.seed) of every run: per seed group, `plan['alone']`
  members alone (train.seed = group · population + member), then each population run."""
  out = []
  for group in plan['seeds']:
    out += [(f'alone_s{group}_m{j}', 'alone', group, group * plan['population'] + j)
            for j in range(plan['alone'])]
    out += [(f'{m}_s{group}', m, group, group) for m in methods(plan)[1:]]
  return out


def run(quick: bool, work: Path) -> Report:
  plan = QUICK if quick else FULL

  def one(spec: tuple[str, str, int, int]) -> tuple[str, int, list[dict]]:
    name, method, group, seed = spec
    return method, group, trainer.train(EXP, work / name, _overrides(plan, method, seed))

  results: dict[tuple[str, int], list[dict]] = {}  # (method, group) -> its runs
  with concurrent.futures.ThreadPoolExecutor(plan['workers']) as pool:  # Each run: a process.
    for method, group, rows in pool.map(one, runs(plan)):
      results.setdefault((method, group), []).append(
          {'rows': rows, 'accuracy': final_accuracy(rows)})
  from reproductions import papa_page
  return papa_page.report(quick, plan, results)


def means(plan: dict, results: dict) -> dict[str, float]:
  """Each method's accuracy in points, averaged over seed groups (and, alone, members)."""
  out = {}
  for method in methods(plan):
    accs = [r['accuracy'] for g in plan['seeds'] for r in results[(method, g)]]
    out[method] = sum(accs) / len(accs)
  return out
