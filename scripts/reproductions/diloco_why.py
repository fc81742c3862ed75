"""The diloco page's 'Why': what the measured numbers say against the paper's."""

from __future__ import annotations

from typing import Sequence

ORDER = ('baseline', 'batch', 'diloco', 'updates')


def _pct(a: float, b: float) -> str:
  return f'{100 * (a / b - 1):+.1f}%'


def _main(plan: dict, ppl: dict[str, float]) -> str:
  k = plan['k']
  ranked = ' < '.join(f'{m} {ppl[m]:.3f}' for m in sorted(ORDER, key=ppl.get))
  return (f'At T = {plan["steps"]} inner steps (mean of {len(plan["seeds"])} seeds): baseline '
          f'{ppl["baseline"]:.3f}, {k}× batch {ppl["batch"]:.3f} '
          f'({_pct(ppl["batch"], ppl["baseline"])}), DiLoCo {ppl["diloco"]:.3f} '
          f'({_pct(ppl["diloco"], ppl["baseline"])}), {k}× updates {ppl["updates"]:.3f} '
          f'({_pct(ppl["updates"], ppl["baseline"])}); the paper\'s Table 2 (8 workers): '
          '−5.7%, −7.5%, −9.3%. Ranked: ' + ranked + '. DiLoCo, communicating once every '
          f'{plan["h"]} steps, is far better than the single worker, as in the paper.')


def _diagnostic(plan: dict, per_seed: dict, diag: dict[float, dict[str, float]]) -> str:
  """What the lower inner rate changes (seed one)."""
  from reproductions.diloco import verdict
  if not diag:
    return 'No diagnostic ran.'
  seed, k = plan['seeds'][0], plan['k']
  rates = ', '.join(f'{lr:g}' for lr in diag)
  reached = ', '.join(f'{d["updates"]:.3f}' for d in diag.values())
  parts = []
  for lr, d in diag.items():
    _, failed = verdict(d, {}, {})
    cells = ', '.join(f'{m} {d[m]:.3f}' for m in ORDER)
    parts.append(f'at inner lr {lr:g} (seed {seed}): {cells}; of the Table 2 conditions '
                 + ('all hold' if not failed else 'these fail: ' + '; '.join(failed)))
  first = diag[min(diag)]
  return (f'Why k× batch beats k× updates at the experiments\' inner lr 3e-3: {k}× updates '
          'is the same optimizer, rate and data stream as k× batch with k times as many steps '
          'of k times smaller batches; at a rate that suits both it should not lose to the '
          'big-batch run, and it does here only because the small steps are held up by '
          'gradient noise: a step sees 8 × 64 = 512 bytes (the paper\'s 512 × 1,024 tokens), '
          f'and at 3e-3 batch-8 AdamW sits on its noise floor ({k * plan["steps"]} steps at '
          f'3e-3 reach {per_seed[("updates", seed)]:.3f}, the same steps at {rates} reach '
          f'{reached}). The same noise puts DiLoCo behind k× batch: its replicas take H noisy '
          'batch-8 steps before their changes are averaged, where k× batch averages every '
          f'step (the gap is {per_seed[("diloco", seed)] - per_seed[("batch", seed)]:.3f} at '
          f'3e-3 and {first["diloco"] - first["batch"]:.3f} at {min(diag):g}, seed {seed}). '
          'The diagnostic reruns the comparison at a lower rate: ' + '; '.join(parts) + '.')


def _seed_spread(plan: dict, per_seed: dict) -> float:
  values = [per_seed[('diloco', s)] for s in plan['seeds']]
  return max(values) - min(values)


def _replica_steps(plan: dict) -> int:
  """Inner steps × workers over every run of the plan (batch-4B steps count k)."""
  k, t = plan['k'], plan['steps']
  main = 3 * k * t * len(plan['seeds'])
  ablations = k * t * (len(plan['hs']) - 1 + 1 + len(plan['adam_lrs'])
                       + len(plan.get('nesterov_lrs', ())))
  diagnostics = k * t * (3 * len(plan.get('diagnostic_lrs', ())) +
                         len(plan.get('small_h_outer', {})))
  return plan['warmup'] + main + ablations + diagnostics


def _without_diagnostics(plan: dict) -> dict:
  return {**plan, 'diagnostic_lrs': (), 'small_h_outer': {}, 'nesterov_lrs': ()}


def _h_sentence(plan: dict, by_h: dict[int, float], baseline: float,
                small: dict[str, float]) -> str:
  if len(by_h) < 2:
    return 'No H ablation ran.'
  cells = ', '.join(f'H = {h} ({plan["steps"] // h} rounds): {p:.3f} ({_pct(p, baseline)} vs '
                    'the baseline)' for h, p in sorted(by_h.items()))
  lo, hi = min(by_h), max(by_h)
  text = (f'By H, at T = {plan["steps"]} (seed {plan["seeds"][0]}): {cells}. The paper varied H '
          'from 50 to 2,000 over 64k steps (1,280 to 32 outer steps) and lost a few percent. '
          f'At our T, H = {hi} leaves {plan["steps"] // hi} outer steps, too few for the '
          'outer momentum to build up or for the average to correct the replicas\' drift.')
  if small:
    names = {'sgd': 'SGD at lr 1'}
    outer = ', '.join(f'{names.get(label, label.replace("nesterov", "Nesterov at lr "))} '
                      f'{p:.3f}' for label, p in small.items())
    text += (f' H = {lo} with other outer steps: {outer} (Nesterov lr 0.7: '
             f'{by_h[lo]:.3f}). Nesterov at lr 0.7 and momentum 0.9 multiplies each round\'s '
             'mean change by up to 0.7 / (1 − 0.9) = 7; with only '
             f'{lo} noisy inner steps a round that change is mostly noise, so the outer step '
             'amplifies the noise: the paper tuned these outer settings at H = 500. Without '
             'the amplification, averaging every 4 steps brings DiLoCo close to k× batch.')
  return text


def _outer_sentence(by_outer: dict[str, float], nesterov: dict[float, float],
                    adam: dict[float, float], spread: float) -> str:
  if len(by_outer) < 2:
    return 'No outer-optimizer ablation ran.'
  cells = lambda by: ', '.join(f'{p:.3f} at lr {lr:g}' for lr, p in sorted(by.items()))
  best = min(by_outer, key=by_outer.get)
  gap = by_outer['nesterov'] - by_outer[best]
  verdict = ('Nesterov is best, as in the paper' if best == 'nesterov' else
             f'outer {best.replace("sgd", "SGD").replace("adam", "Adam")} beats the best '
             f'Nesterov by {gap:.3f} here, unlike the paper, though that is within the '
             f'{spread:.3f} between the two seeds of the main DiLoCo run; Adam trails both, '
             'as in the paper')
  return (f'Outer optimizer (H = 16): Nesterov {cells(nesterov)}; SGD at lr 1 (FedAvg) '
          f'{by_outer["sgd"]:.3f}; Adam {cells(adam)}: {verdict}. Outer SGD at lr 1 only '
          'averages the replicas; Nesterov\'s momentum extrapolates along the direction '
          'successive rounds agree on, which pays when a round\'s mean change is mostly '
          'signal (the paper\'s 500 steps of batch 512 × 1,024 tokens) and amplifies noise '
          'when it is not (our 16 steps of 512 bytes, 16 rounds for the momentum to build).')


def why(plan: dict, ppl: dict[str, float], per_seed: dict, by_h: dict[int, float],
        by_outer: dict[str, float], nesterov: dict[float, float], adam: dict[float, float],
        diag: dict[float, dict[str, float]], small: dict[str, float],
        failed: Sequence[str]) -> str:
  """The explanation, from the perplexities."""
  b = plan['batch']
  lines = [
      _main(plan, ppl), '', _diagnostic(plan, per_seed, diag), '',
      _h_sentence(plan, by_h, ppl['baseline'], small), '',
      _outer_sentence(by_outer, nesterov, adam, _seed_spread(plan, per_seed)), '',
      'What differs from the paper, and why: a ~1M-parameter byte LM on Tiny Shakespeare '
      f'(1 MB), batch {b} × {plan["seq_len"]} bytes per worker and T = {plan["steps"]} '
      f'steps after a {plan["warmup"]}-step warm-up, instead of a 150M-parameter model on C4 '
      'with batch 512 × 1,024 tokens and 64k steps after 24k; k = 4 (the issue\'s setting), '
      f'not 8; H = {plan["h"]} instead of 500 (T/H must leave enough outer steps: '
      f'{plan["steps"] // plan["h"]} here, 128 there); a constant inner rate (the paper '
      'decays it with a cosine), which is what lets the baseline be read off the k× '
      'updates run. Byte perplexities near 6 are not comparable with C4 token perplexities '
      'near 15; the ordering and the relative gaps are what the page compares. None of the '
      'failures points at paxlike\'s DiLoCo: it matches the paper\'s update exactly (the '
      'issue\'s audit), and each failure moves as the setting\'s gradient noise and '
      'outer step size predict (the diagnostics).',
      *([] if plan['steps'] < 100 else [
          '', 'Time: the 2-core machine was shared while this page was made (load average '
          '8–13, some runs two at a time), so the minutes in the header are the runs\' '
          f'training time under that load. The plan is {_replica_steps(plan):,} replica-steps '
          f'of batch {b} in all; at the ~11 steps a second measured at a load near 3 that is '
          f'{_replica_steps(plan) / 11 / 60:.0f} minutes plus start-ups, less on an idle '
          'machine but probably over the ~15-minute target: the diagnostics '
          f'({_replica_steps(plan) - _replica_steps(_without_diagnostics(plan)):,} of the '
          'replica-steps) push it over; without them (`diagnostic_lrs`, `small_h_outer` and '
          '`nesterov_lrs` off in FULL) it is '
          f'{_replica_steps(_without_diagnostics(plan)):,}.']),
  ]
  if failed:
    lines += ['', 'Conditions not met: ' + '; '.join(failed) + '.']
  return '\n'.join(lines)
