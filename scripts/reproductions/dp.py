"""dp: DP-FedAvg's accountant and the cost of its noise (McMahan et al. 2018; Andrew et al. 2021).

Three checks, each through paxlike's own code:
1. the accountant (paxlike.trainer.privacy, on dp_accounting) against the paper's Table 1;
   and every DP training row's `dp_epsilon` against that accountant;
2. at a fixed noise multiplier z, the accuracy the noise costs (noised run vs the same run at
   z = 0) shrinks as the cohort grows: the noise on the mean update is z·C / cohort;
3. adaptive clipping to the median norm is within a point of the best fixed clip, found
   afterwards over a grid (2 seeds).
Training: federated.DigitsDpFedAvg (400 clients of 3–4 digits, 100 rounds, adaptive clipping
from C = 0.5, z = 6), varied by `--fdl_set` overrides only.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from reproductions import trainer
from reproductions.page import Report

NAME, TITLE = 'dp', 'DP-FedAvg: the accountant, the noise cost vs cohort, adaptive clipping'
EXP = 'federated.DigitsDpFedAvg'
POPULATION, NOISE, DELTA = 400, 6.0, 1e-5  # The experiment's own settings.
RUN_IMPORTS = ('dp_accounting',)  # Each run's accountant (scripts/reproduce.py's preload).
# McMahan et al. 2018, Table 1 (the row K = 1e5 users, C = 100 expected per round, z = 1):
# ε at δ = K^-1.1 after 1 round and after 1e5 rounds.
PAPER_TABLE1 = dict(population=10**5, cohort=100, noise=1.0, epsilon={1: 0.70, 100_000: 1.90})
TOLERANCE = 0.01  # The paper prints two decimals.


def paper_accountant(rounds: Sequence[int], pld: bool) -> list[list[Any]]:
  """Rows (rounds, paper ε, ours Poisson RDP, [ours Poisson PLD], ours uniform RDP) in the
  Table 1 setting, from paxlike.trainer.privacy."""
  from paxlike.trainer import privacy
  k, c, z = PAPER_TABLE1['population'], PAPER_TABLE1['cohort'], PAPER_TABLE1['noise']
  delta = k**-1.1
  poisson = privacy.round_event(z, 'poisson', c, k)
  uniform = privacy.round_event(z, 'without_replacement', c, k)
  rows = []
  for r in rounds:
    row = [r, PAPER_TABLE1['epsilon'].get(r), privacy.epsilon(poisson, r, delta, 'rdp')]
    if pld:
      row.append(privacy.epsilon(poisson, r, delta, 'pld'))
    rows.append(row + [privacy.epsilon(uniform, r, delta, 'rdp')])
  return rows


def accountant_matches(ours: dict[int, float], paper: dict[int, float],
                       tolerance: float = TOLERANCE) -> bool:
  """Whether our ε equals the paper's at every round count it reports."""
  return all(r in ours and abs(ours[r] - eps) <= tolerance for r, eps in paper.items())


def rows_epsilon_error(rows: Sequence[dict], cohort: int) -> float:
  """The largest gap between a DP run's logged `dp_epsilon` and the accountant's ε for its
  setting (uniform cohorts, i.e. sampled without replacement, at the experiment's z and δ)."""
  from paxlike.trainer import privacy
  event = privacy.round_event(NOISE, 'without_replacement', cohort, POPULATION)
  return max(abs(row['dp_epsilon'] - privacy.epsilon(event, row['step'], DELTA, 'rdp'))
             for row in rows if 'dp_epsilon' in row)


def cohort_verdict(costs: Sequence[tuple[int, float]], slack: float = 0.01) -> str:
  """'reproduced' if the noise's accuracy cost falls as the cohort grows (each step up may
  rise by at most `slack`, noise of the eval) and the largest cohort's cost is under half the
  smallest's; 'partly' if it is merely lower at the largest cohort; else 'not'."""
  values = [cost for _, cost in sorted(costs)]
  if values[-1] >= values[0]:
    return 'not'
  falling = all(b <= a + slack for a, b in zip(values, values[1:]))
  return 'reproduced' if falling and values[-1] < values[0] / 2 else 'partly'


def clip_verdict(adaptive: float, fixed: dict[float, float]) -> str:
  """'reproduced' if adaptive clipping is within one point of the best fixed clip (or above
  it), 'partly' within three, else 'not'."""
  gap = max(fixed.values()) - adaptive
  return 'reproduced' if gap <= 0.01 else 'partly' if gap <= 0.03 else 'not'


def overall(parts: Sequence[str]) -> str:
  """All parts reproduced: reproduced; none even partly: not; else partly."""
  if all(p == 'reproduced' for p in parts):
    return 'reproduced'
  return 'not' if all(p == 'not' for p in parts) else 'partly'


def _plan(quick: bool) -> dict[str, Any]:
  if quick:
    return dict(rounds=2, cohorts=(100,), clips=(0.3,), seeds=(0,), eval_every=2,
                accountant_rounds=(1, 100_000), pld=False, fields={'data.local_steps': 1})
  return dict(rounds=100, cohorts=(25, 100, 400), clips=(0.1, 0.3, 1.0, 3.0), seeds=(0, 1),
              eval_every=25, accountant_rounds=(1, 10, 100, 1000, 10_000, 100_000), pld=True)


def _train(work: Path, name: str, plan: dict, **fields: Any) -> list[dict]:
  overrides = {'train.num_steps': plan['rounds'], 'train.eval_every': plan['eval_every'],
               'train.log_every': plan['eval_every'], 'train.checkpoint_every': 100_000,
               'algorithm.aggregator.max_epsilon': None, **plan.get('fields', {}), **fields}
  return trainer.train(EXP, work / name, overrides)


def _final(rows: Sequence[dict]) -> float:
  return [row['eval_accuracy'] for row in rows if 'eval_accuracy' in row][-1]


def run(quick: bool, work: Path) -> Report:
  plan = _plan(quick)
  accountant = paper_accountant(plan['accountant_rounds'], plan['pld'])
  ours = {row[0]: row[2] for row in accountant}
  runs: dict[tuple, list[dict]] = {}
  for c in plan['cohorts']:
    for z in (0.0, NOISE):
      runs[('cohort', c, z)] = _train(
          work, f'cohort{c}_z{z:g}', plan, **{'data.clients_per_round': c,
                                             'algorithm.aggregator.noise_multiplier': z,
                                             'algorithm.aggregator.count_stddev': z})
  for seed in plan['seeds']:
    for clip in plan['clips']:
      runs[('fixed', clip, seed)] = _train(
          work, f'fixed{clip:g}_seed{seed}', plan, **{'train.seed': seed,
                                                     'algorithm.aggregator.clip_norm': clip,
                                                     'algorithm.aggregator.target_quantile': None})
    runs[('adaptive', seed)] = (runs[('cohort', 100, NOISE)] if seed == 0 else _train(
        work, f'adaptive_seed{seed}', plan, **{'train.seed': seed}))
  return _report(quick, plan, accountant, ours, runs)


def _report(quick: bool, plan: dict, accountant: list, ours: dict, runs: dict) -> Report:
  cohorts, seeds = plan['cohorts'], plan['seeds']
  costs = [(c, _final(runs[('cohort', c, 0.0)]) - _final(runs[('cohort', c, NOISE)]))
           for c in cohorts]
  fixed = {clip: sum(_final(runs[('fixed', clip, s)]) for s in seeds) / len(seeds)
           for clip in plan['clips']}
  adaptive = sum(_final(runs[('adaptive', s)]) for s in seeds) / len(seeds)
  trainer_gap = max(rows_epsilon_error(runs[('cohort', c, NOISE)], c) for c in cohorts)
  matches = accountant_matches(ours, PAPER_TABLE1['epsilon']) and trainer_gap < 1e-6
  parts = ['reproduced' if matches else 'not', cohort_verdict(costs),
           clip_verdict(adaptive, fixed)]
  numbers = {'epsilon_1_round': ours[1], 'epsilon_1e5_rounds': ours[100_000],
             'paper_epsilon': PAPER_TABLE1['epsilon'], 'trainer_epsilon_max_error': trainer_gap,
             'noise_cost_by_cohort': dict(costs), 'adaptive_accuracy': adaptive,
             'fixed_clip_accuracy': fixed, 'parts': dict(zip(
                 ('accountant', 'cohort', 'adaptive_clip'), parts))}
  from reproductions import dp_page
  return dp_page.report(quick, plan, accountant, runs, costs, fixed, adaptive, trainer_gap,
                        parts, overall(parts), numbers, _final)


def epsilon_of(rows: Sequence[dict]) -> float:
  """The run's last logged ε (inf for z = 0)."""
  values = [row['dp_epsilon'] for row in rows if 'dp_epsilon' in row]
  return values[-1] if values else math.nan
