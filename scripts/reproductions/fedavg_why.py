"""The fedavg page's 'Why': what the measured numbers say against the paper's."""

from __future__ import annotations

from typing import Sequence


def _fmt(pairs: Sequence[tuple[int, float | None]]) -> str:
  return ', '.join(f'{"not reached" if s is None else f"{s:.1f}×"} at u = {u}' for u, s in pairs)


def _unreached(plan: dict, results: dict, target: float) -> str:
  """A sentence on the non-IID FedAvg configs that never reached `target` (their speedup is
  only bounded)."""
  base = results[('shards', 1, None)]['rounds'][target]
  cap = plan['caps']['fedavg']['shards']
  missed = [(e, b) for e, b in plan['configs']
            if b is not None and results[('shards', e, b)]['rounds'][target] is None]
  if not missed or base is None:
    return ''
  names = ', '.join(f'E = {e}, B = {b}' for e, b in missed)
  return (f' {names} did not reach {100 * target:g}% within its {cap}-round cap, so its '
          f'speedup is below {base / cap:.1f}× (the paper\'s E = 1, B = 50 was slower than '
          'FedSGD too).')


def why(plan: dict, results: dict, iid_high: Sequence, iid_low: Sequence, non_iid: Sequence,
        failed: Sequence[str]) -> str:
  """The explanation, from the speedups (u, speedup) and the runs."""
  high, low = max(plan['targets']['iid']), min(plan['targets']['shards'])
  sgd = {p: results[(p, 1, None)] for p in ('iid', 'shards')}
  lines = [
      f'IID, to {100 * high:g}%: FedSGD (lr {sgd["iid"]["lr"]:g}) took '
      f'{sgd["iid"]["rounds"][high]} rounds; FedAvg\'s speedups are {_fmt(iid_high)} (the '
      'paper: 9.6×, 18.4×, 31× at u = 12, 60, 300). To '
      f'{100 * min(plan["targets"]["iid"]):g}%: {_fmt(iid_low)}.',
      '',
      f'Non-IID, to {100 * low:g}%: FedSGD (lr {sgd["shards"]["lr"]:g}) took '
      f'{sgd["shards"]["rounds"][low]} rounds; FedAvg: {_fmt(non_iid)} (the paper: 0.8×, '
      f'1.4×, 2.1×).{_unreached(plan, results, low)} The gain from local work is an order of '
      'magnitude smaller than on IID clients, as in the paper: each client\'s 2 labels pull '
      'its model away from the others\' (client drift), so the averaged model oscillates '
      '(see the plot) and plateaus below the IID one.',
      '',
      'Our speedups at u = 300 are larger than the paper\'s (IID and non-IID) and those at '
      'u = 12 a little smaller: the speedup depends on where the target sits on each curve, '
      'and our targets sit lower on a harder task\'s curve than the paper\'s 99% on MNIST.',
      '',
      'What differs from the paper, and why: Fashion-MNIST is harder than MNIST (our MLP\'s '
      'plateau is ~86%, not 98%+), and we time 80–84% targets within 100–800 rounds where '
      'the paper timed 99% on MNIST over hundreds to thousands. The speedups also hang on '
      f'FedSGD\'s learning rate: its best rate was {sgd["iid"]["lr"]:g} IID and '
      f'{sgd["shards"]["lr"]:g} non-IID (the noisier '
      'non-IID gradients need the smaller one), so the grid is spent on the baseline, which '
      'keeps the speedups conservative; FedAvg used one rate per batch size, from pilots.',
  ]
  if failed:
    lines += ['', 'Conditions not met: ' + '; '.join(failed) + '.']
  return '\n'.join(lines)
