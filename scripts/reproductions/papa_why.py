"""The papa page's 'Why': what the soups, the members' spread and the evals' noise say."""

from __future__ import annotations

import numpy as np

from reproductions.papa import KEY, MIN_GAIN, TIE


def swing(results: dict, method: str, seeds) -> float:
  """Mean |change| of test accuracy between consecutive evals over the second half of each run
  of `method`, in points, averaged over its runs."""
  moves = []
  for g in seeds:
    for run in results[(method, g)]:
      acc = [100 * row[KEY] for row in run['rows'] if KEY in row]
      half = acc[len(acc) // 2:]
      if len(half) > 1:
        moves.append(np.mean(np.abs(np.diff(half))))
  return float(np.mean(moves)) if moves else 0.0


def seed_gains(plan: dict, results: dict, method: str) -> list[float]:
  """`method` minus the members trained alone, per seed group, in points."""
  mean = lambda k, g: np.mean([r['accuracy'] for r in results[(k, g)]])
  return [float(mean(method, g) - mean('alone', g)) for g in plan['seeds']]


def _soups(m: dict) -> str:
  own, same, papa = m['soup'], m.get('soup_same'), m['papa']
  text = (f"The uniform soup of independent members from their own inits scores {own:.1f}%, "
          f"{m['alone'] - own:.1f} points below its members: networks trained apart from "
          "different inits sit in different basins (and hidden units in different orders), "
          "so their average is a poor network. PAPA's pull toward the "
          f"mean fixes that: its population's average scores {papa:.2f}%. ")
  if same is None:
    text += 'This run has no soup from one shared init.'
  elif same >= papa - TIE:
    text += (f"From one shared init, however, the soup of independent members already scores "
             f"{same:.2f}% ({same - m['alone']:+.2f} over its members, PAPA "
             f"{papa - m['alone']:+.2f}): this small MLP, trained for a few epochs at a constant "
             "rate with only its data order to tell the members apart, stays in one linearly "
             "connected basin (Frankle et al. 2020 found the same of small networks on MNIST), "
             "so averaging at the end works without any pull and PAPA has little to add. The "
             "paper's members differ far more (different inits, augmentations and "
             "regularizers, 300 epochs), which is where a soup of independent models fails "
             "and PAPA's gradual pull is needed: a setting and scale effect, not a defect of "
             "the algorithm.")
  else:
    text += (f"From one shared init the soup of independent members scores {same:.2f}%, "
             f"below PAPA's average: the pull keeps the members close enough to average "
             "better than independent training from one init does.")
  return text


def _noise(plan: dict, results: dict, m: dict) -> str:
  gains = seed_gains(plan, results, 'papa')
  spread = [max(r['accuracy'] for r in results[('alone', g)])
            - min(r['accuracy'] for r in results[('alone', g)]) for g in plan['seeds']]
  return (f"How much of a gain is signal: PAPA's gain per seed is "
          f"{', '.join(f'{g:+.2f}' for g in gains)} points; the members trained alone spread "
          f"{', '.join(f'{s:.2f}' for s in spread)} points within a seed, and a member's test "
          f"accuracy moves {swing(results, 'alone', plan['seeds']):.2f} points from one eval to "
          f"the next late in training (constant learning rate), a population average's "
          f"{swing(results, 'papa', plan['seeds']):.2f}. Averaging the population removes much "
          "of the members' SGD noise, which is most of what it gains here.")


def _variants(plan: dict, m: dict) -> str:
  return (f"PAPA-all (every member replaced by the mean) gains {m['papa_all'] - m['alone']:+.2f} "
          f"points and PAPA-2 (averages of random pairs) {m['papa_2'] - m['alone']:+.2f}. "
          "Until PAPA-all's first averaging its rows are exactly the uniform soup's (it "
          "keeps the mean, which is what is evaluated); its first averaging collapses "
          f"{plan['population']} unrelated networks into their poor mean, which training then "
          "repairs.")


def why(plan: dict, results: dict, m: dict, failed: list[str]) -> str:
  gain = m['papa'] - m['alone']
  head = (f"PAPA's average beats the mean of the members trained alone by {gain:+.2f} points "
          f"(the paper: +0.8 on CIFAR-10, +1.9 on CIFAR-100; our bar for 'reproduced' is "
          f"{MIN_GAIN:g}). Fashion-MNIST with a {plan['hidden']} MLP leaves less room than "
          f"CIFAR-100 with a ResNet: the members alone reach {m['alone']:.1f}%, close to what "
          "this model can do.")
  parts = [head, _soups(m), _variants(plan, m), _noise(plan, results, m)]
  if failed:
    parts.append('Not met: ' + '; '.join(failed) + '.')
  return '\n\n'.join(parts)
