"""The scaffold page's 'Why': what the measured rounds say against the paper's."""

from __future__ import annotations

from typing import Sequence


def _r(rounds: dict, key: tuple, cap: int) -> str:
  return f'> {cap}' if rounds[key] is None else str(rounds[key])


def fixed_rate(plan: dict, results: dict, method: str, similarity: int) -> str:
  """Rounds of `method` at each epoch count for every learning rate of its grid."""
  cap = plan['caps'][method]
  parts = []
  for lr in plan['lrs'][method]:
    rounds = []
    for e in plan['epochs']:
      run = next(c for c in results[(method, e, similarity)]['all'] if c['lr'] == lr)
      got = run['rounds'][plan['target']]
      rounds.append(f'> {cap}' if got is None else str(got))
    parts.append(f'lr {lr:g}: ' + ' → '.join(rounds))
  return '; '.join(parts)


def saturation(plan: dict, results: dict) -> str:
  """FedAvg's first round at 0% similarity and its largest rate: the clients' loss after
  their local epochs and the update's norm, at the fewest and the most epochs."""
  lr, (few, most) = max(plan['lrs']['fedavg']), (plan['epochs'][0], plan['epochs'][-1])
  first = {e: next(c for c in results[('fedavg', e, 0)]['all'] if c['lr'] == lr)['rows'][0]
           for e in (few, most)}
  return (f'in the first round at lr {lr:g}, the clients\' loss after local training is '
          f'{first[few]["loss_after"]:.3f} after {few} epoch(s) (from '
          f'{first[few]["loss_before"]:.2f}) and {first[most]["loss_after"]:.3f} after {most}, '
          f'and the averaged update\'s norm grows only from {first[few]["pseudo_grad_norm"]:.2f} '
          f'to {first[most]["pseudo_grad_norm"]:.2f} for {most // few}× the local steps')


def why(plan: dict, results: dict, rounds: dict, failed: Sequence[str]) -> str:
  """The explanation, from rounds[(method, epochs, similarity)]."""
  caps, epochs = plan['caps'], plan['epochs']
  at = lambda m, s: ', '.join(f'{_r(rounds, (m, e, s), caps[m])} at {e} epoch(s)'
                              for e in epochs)
  lines = [
      f'0% similarity (one class per client): SGD {_r(rounds, ("sgd", 1, 0), caps["sgd"])} '
      f'rounds; FedAvg {at("fedavg", 0)}; SCAFFOLD {at("scaffold", 0)} (the paper: SGD 317, '
      'FedAvg 258 → 711, SCAFFOLD 77 → 286 from 1 to 10 epochs).',
      '',
      *[line for s in plan['similarities'][1:] for line in (
          f'{s}% similarity: SGD {_r(rounds, ("sgd", 1, s), caps["sgd"])}; FedAvg '
          f'{at("fedavg", s)}; SCAFFOLD {at("scaffold", s)}.', '')],
      'SCAFFOLD\'s part of the claim holds: on one-class clients it beats SGD at every epoch '
      'count and gets faster with more local work, where FedAvg stays near SGD. Its step '
      'along g − cᵢ + c replaces the client\'s gradient bias by the population\'s, so its '
      'local epochs stay useful. With every client in every round (20 clients) the control '
      'variates are never stale, the setting most favourable to SCAFFOLD.',
      '',
      'FedAvg\'s part does not: with its rate tuned per epoch count, FedAvg needs about as '
      'many rounds at 10 epochs as at 1, not 2.8× more as in the paper. By rate, the rounds '
      f'at {" → ".join(f"{e}" for e in epochs)} epochs on 0% similarity are '
      f'{fixed_rate(plan, results, "fedavg", 0)}: at the larger rate the drift shows (10 '
      'epochs are slower than 5), at the smaller one more epochs still help, and the tuning '
      'picks the smaller rate for 10 epochs. A scale effect, we think, not a bug (SCAFFOLD\'s '
      'correction, the same client loop plus cᵢ, does what the paper says): a digits client '
      'holds 72 images of one class, and softmax regression on one class saturates within an '
      f'epoch ({saturation(plan, results)}), so extra epochs add little further drift; the '
      'paper\'s EMNIST clients hold far more data of a 47-class problem.',
  ]
  if failed:
    lines += ['', 'Conditions not met: ' + '; '.join(failed) + '.']
  return '\n'.join(lines)
