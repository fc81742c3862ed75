"""fedprox: FedProx keeping stragglers' partial work vs FedAvg dropping them (Li et al. 2020).

90% of each round's clients straggle (`data.straggler_fraction=0.9`: each runs a uniform 1 to
local_steps - 1 of its local steps). FedAvg drops them (their update gets weight 0, the
paper's baseline); FedProx (`algorithm.prox_mu` > 0) keeps their partial work, and so does
"FedProx μ = 0" (`algorithm.drop_stragglers=False`), which separates what keeping the work
does from what the proximal term does. All are `federated.DigitsFedAvg` (client SGD, server
SGD at lr 1) moved onto Fashion-MNIST with softmax regression by `--fdl_set` overrides: 100
clients, 2 label-sorted shards each (non-IID, the paper's MNIST construction) or an IID share,
10 a round. FedProx's μ is the best of the paper's grid per partition; FedAvg's client
learning rate the best of a small grid. A run's accuracy is the mean of its last evals (FedAvg
under stragglers oscillates), averaged over seeds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from reproductions import trainer
from reproductions.page import Report

NAME, TITLE = 'fedprox', 'FedProx vs FedAvg with 90% stragglers, non-IID and IID'
EXP = 'federated.DigitsFedAvg'
KEY = 'eval_accuracy'
PARTITIONS = ('shards', 'iid')
FULL = dict(dataset='fashion_mnist', clients=100, cohort=10, local_steps=20, batch=10,
            rounds=200, eval_every=10, tail=5, stragglers=0.9, lr=0.05,
            fedavg_lrs=(0.01, 0.05), mus=(0.001, 0.01, 0.1, 1.0), seeds=(0, 1), eval_batches=None,
            mu0=True, drift=dict(local_steps=100, lr=0.2, mus=(0.0, 1.0)))
QUICK = dict(dataset='digits', clients=20, cohort=5, local_steps=4, batch=8, rounds=2,
             eval_every=2, tail=1, stragglers=0.9, lr=0.05, fedavg_lrs=(0.05,), mus=(1.0,),
             seeds=(0,), eval_batches=None, mu0=False, drift=None)
MIN_GAIN = 5.0  # Points FedProx must gain on non-IID data (the paper: 22 on average).
SMALL = 3.0     # Points within which the methods count as alike on IID data.


def final_accuracy(rows: Sequence[dict], tail: int) -> float:
  """The mean of the last `tail` evals' accuracy (a run that oscillates has no last value)."""
  evals = [row[KEY] for row in rows if KEY in row]
  if not evals:
    raise ValueError('the run logged no eval accuracy')
  last = evals[-tail:]
  return sum(last) / len(last)


def best(accuracies: dict[float, Sequence[float]]) -> tuple[float, float]:
  """(setting, mean accuracy over seeds) of the best setting (a μ, or a learning rate)."""
  means = {k: sum(v) / len(v) for k, v in accuracies.items()}
  key = max(means, key=lambda k: (means[k], -k))  # Ties: the smaller setting.
  return key, means[key]


def verdict(non_iid_gain: float, iid_gain: float) -> tuple[str, list[str]]:
  """(verdict, failed conditions) from best FedProx minus FedAvg, in accuracy points, on
  non-IID and IID data. Reproduced: FedProx gains at least MIN_GAIN points on non-IID data and
  the two are within SMALL points on IID data. Not: FedProx does not beat FedAvg on non-IID
  data. Else partly."""
  if not non_iid_gain > 0:
    return 'not', ['FedProx beats FedAvg on non-IID data']
  failed = []
  if non_iid_gain < MIN_GAIN:
    failed.append(f'FedProx gains at least {MIN_GAIN:g} points on non-IID data')
  if abs(iid_gain) > SMALL:
    failed.append(f'on IID data the two are within {SMALL:g} points')
  return ('reproduced' if not failed else 'partly'), failed


def _overrides(plan: dict, partition: str, seed: int, lr: float, mu: float | None,
               local_steps: int | None = None) -> dict:
  """The CLI overrides of one run; `mu` None is FedAvg (stragglers dropped), else FedProx
  with that μ keeping them (μ = 0: no proximal term); `local_steps`: the plan's unless set."""
  fields = {'data.dataset': plan['dataset'], 'data.num_clients': plan['clients'],
            'data.clients_per_round': plan['cohort'], 'data.partition': partition,
            'data.shards_per_client': 2, 'data.local_steps': local_steps or plan['local_steps'],
            'data.batch_size': plan['batch'], 'data.num_eval_batches': plan['eval_batches'],
            'data.straggler_fraction': plan['stragglers'], 'model.hidden': '()',
            'optimizer.learning_rate': lr, 'train.seed': seed,
            'train.num_steps': plan['rounds'], 'train.eval_every': plan['eval_every'],
            'train.log_every': plan['eval_every'], 'train.checkpoint_every': 100_000}
  if mu is not None:
    fields.update({'algorithm.prox_mu': mu, 'algorithm.drop_stragglers': False})
  return fields


def runs(plan: dict) -> list[tuple[str, tuple, int, dict]]:
  """(name, result key, seed, CLI overrides) of every run. Keys: (partition, 'fedavg', lr),
  (partition, 'fedprox', μ), and ('shards', 'drift', μ): FedProx with the plan's `drift`
  (more local work, non-IID), where the proximal term has more drift to curb."""
  out = []
  for partition in PARTITIONS:
    for seed in plan['seeds']:
      out += [(f'{partition}_fedavg_lr{lr:g}_s{seed}', (partition, 'fedavg', lr), seed,
               _overrides(plan, partition, seed, lr, None)) for lr in plan['fedavg_lrs']]
      out += [(f'{partition}_fedprox_mu{mu:g}_s{seed}', (partition, 'fedprox', mu), seed,
               _overrides(plan, partition, seed, plan['lr'], mu))
              for mu in ((0.0,) if plan['mu0'] else ()) + tuple(plan['mus'])]
  drift = plan['drift']
  for seed in plan['seeds'] if drift else ():
    out += [(f'shards_drift_mu{mu:g}_s{seed}', ('shards', 'drift', mu), seed,
             _overrides(plan, 'shards', seed, drift['lr'], mu, drift['local_steps']))
            for mu in drift['mus']]
  return out


def run(quick: bool, work: Path) -> Report:
  plan = QUICK if quick else FULL
  results: dict[tuple, list[dict]] = {}  # See `runs` for the keys.
  for name, key, seed, overrides in runs(plan):
    rows = trainer.train(EXP, work / name, overrides)
    results.setdefault(key, []).append(
        {'seed': seed, 'rows': rows, 'accuracy': final_accuracy(rows, plan['tail'])})
  from reproductions import fedprox_page
  return fedprox_page.report(quick, plan, results)


def summary(plan: dict, results: dict, partition: str) -> dict:
  """A partition's best FedAvg (lr) and best FedProx (μ > 0), FedProx μ = 0, and the gain."""
  acc = lambda method, k: [r['accuracy'] for r in results[(partition, method, k)]]
  lr, fedavg = best({lr: acc('fedavg', lr) for lr in plan['fedavg_lrs']})
  mu, fedprox = best({mu: acc('fedprox', mu) for mu in plan['mus']})
  mu0 = best({0.0: acc('fedprox', 0.0)})[1] if plan['mu0'] else None
  return {'fedavg': fedavg, 'fedavg_lr': lr, 'fedprox': fedprox, 'mu': mu, 'fedprox_mu0': mu0,
          'gain': 100 * (fedprox - fedavg),
          'gain_mu0': None if mu0 is None else 100 * (mu0 - fedavg)}
