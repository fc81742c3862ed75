"""The btm page's 'Why': what the experts' specialization, the dense model's learning curve and
the averages' weights say."""

from __future__ import annotations

import numpy as np

from reproductions import trainer
from reproductions.btm import DOMAINS, MIN_NATS


def specialization(experts: np.ndarray) -> float:
  """How much better a domain's own expert is than the others on it: the mean over domains of
  (the other experts' mean loss − the own expert's loss), nats per byte."""
  k = len(experts)
  others = (experts.sum(axis=0) - np.diag(experts)) / (k - 1)
  return float(np.mean(others - np.diag(experts)))


def equal_tokens_round(plan: dict) -> float:
  """The round at which the dense model has trained on as many bytes as one expert has (the
  seed's, then its own domain's): S + (R − S) / K."""
  return plan['seed_rounds'] + (plan['rounds'] - plan['seed_rounds']) / DOMAINS


def loss_at(rows: list[dict], key: str, step: float) -> float | None:
  """`key` at the eval of round `step` (None: no eval then)."""
  steps, values = trainer.series(rows, key)
  return next((v for s, v in zip(steps, values) if s == step), None)


def same_seed(dense: list[dict], domains: list[dict], seed_rounds: int) -> bool:
  """Whether the dense run's rows up to the branch are the BTM run's (the same seed phase)."""
  keys = ('loss', 'eval_loss')
  cut = lambda rows: [{k: r.get(k) for k in ('step', *keys)} for r in rows
                      if r['step'] <= seed_rounds]
  return bool(cut(dense)) and cut(dense) == cut(domains)


def _experts(s: dict, spec: float, spec_random: float) -> str:
  gain = float(np.mean(s['dense'] - s['ensemble']))
  own = float(np.mean(s['dense'] - s['own_expert']))
  wins = int(np.sum(s['dense'] > s['ensemble']))
  return (f"The domain experts' posterior ensemble is {-gain:.4f} nats/byte "
          f"{'worse' if gain < 0 else 'better'} than the dense model of equal compute "
          f"({'better' if gain >= 0 else 'worse'} on {wins if gain >= 0 else 4 - wins} of "
          f"{len(s['dense'])} domains), and a domain's own expert on its own domain is "
          f"{abs(own):.4f} {'worse' if own < 0 else 'better'} than the dense model there. The "
          f"experts did specialize: on its domain a domain's own expert is {spec:.4f} nats/byte "
          f"better than the other experts are (random-split experts: {spec_random:+.4f}, none), "
          "and off their domain they fall behind the seed they branched from. So the mixing "
          "is not what decides the comparison: what each expert learns of its own domain does.")


def _curve(plan: dict, results: dict, s: dict) -> str:
  seed = plan['seeds'][0]
  dense, domains = results[('dense', seed)]['rows'], results[('domains', seed)]['rows']
  at = equal_tokens_round(plan)
  equal = loss_at(dense, 'eval_loss', at)
  branch = loss_at(dense, 'eval_loss', plan['seed_rounds']) or float('nan')
  final = loss_at(dense, 'eval_loss', plan['rounds']) or float('nan')
  ours = loss_at(domains, 'eval_ensemble_loss', plan['rounds'])
  seed_text = ('the seed phase is the dense run\'s, row for row, up to the branch, and '
               if same_seed(dense, domains, plan['seed_rounds']) else '')
  text = (f"Equal compute gives the dense model the same {plan['rounds'] * plan['local_steps']} "
          f"steps with all {DOMAINS} domains' batches in each: after the branch it trains on "
          f"{DOMAINS}× the bytes of any one expert. This tiny byte LM is far from converged "
          f"(all domains, held out: {branch:.3f} at the branch, round {plan['seed_rounds']}, "
          f"{final:.3f} at round {plan['rounds']}), so those bytes are worth more than "
          "specialization.")
  if equal is not None:
    text += (f" At round {at:g}, having seen as many bytes as one expert, the dense model "
             f"scores {equal:.3f} on all domains, the domain experts' ensemble {ours:.3f} at the "
             f"end: per byte each model trained on, the experts are "
             f"{'ahead' if ours < equal else 'behind'} by {abs(equal - ours):.3f}, so "
             "specialization is worth about that much here, against the "
             f"{equal - final:.3f} that the dense model's other bytes (rounds {at:g} to "
             f"{plan['rounds']}) are worth.")
  if plan['long']:
    short, long = (float(np.mean(s[d] - s[e])) for d, e in (('dense', 'ensemble'),
                                                            ('dense_long', 'ensemble_long')))
    text += (f" Trained {plan['long']}× as long (rounds and seed rounds), where the dense "
             "model's curve is flatter, the experts' ensemble is "
             f"{short:+.4f} → {long:+.4f} nats/byte against it: the gap "
             + (f"narrows by {long - short:.4f}, in the direction this explanation predicts, "
                "though far too slowly to close within what these cores can train."
                if long > short else "does not narrow, which this explanation does not "
                "predict."))
  return text + (
      " The paper's experts train on billions of tokens of domains as different as legal text, "
      "medical papers and reviews, where the learning curve is flat enough that k× the data "
      "per model buys little and specialization dominates. That is a scale and setting "
      f"effect; nothing in paxlike's BTM is at fault ({seed_text}the experts train and are "
      "mixed as the paper describes: the audit checked the update rules, and the scoring "
      "here reproduces the trainer's ensemble).")


def _random(s: dict) -> str:
  random = float(np.mean(s['dense'] - s['random_ensemble']))
  margin = float(np.mean(s['random_ensemble'] - s['ensemble']))
  avg = float(np.mean(s['random_ensemble'] - s['random_uniform']))
  return (f"The random-split experts' ensemble is {random:+.4f} nats/byte against the dense "
          f"model{' (it does not beat it, as the paper found)' if random < MIN_NATS else ''}, "
          f"and {margin:+.4f} behind the domain experts' ensemble: what the domain experts "
          "gain over random splits is specialization. Random-split experts are "
          "interchangeable models of the whole corpus, so their uniform parameter average "
          f"beats their ensemble ({avg:+.4f}), as one-shot averaging from a shared seed on "
          "IID data does.")


def _averages(s: dict, weights: np.ndarray) -> str:
  gain = float(np.mean(s['uniform'] - s['weighted']))
  own = float(np.mean(np.diag(weights)))
  vs_ensemble = float(np.mean(s['ensemble'] - s['weighted']))
  return (f"Parameter averages: the posterior-weighted average is {gain:+.4f} nats/byte better "
          f"than the uniform one (the size-weighted merge the trainer logs: "
          f"{float(np.mean(s['merged'])):.4f}, uniform {float(np.mean(s['uniform'])):.4f}). The "
          f"posterior puts {own:.2f} of its weight on the domain's own expert on average, so "
          "the weighted average leans toward it, while the uniform one mixes every expert's "
          f"domain equally. The weighted average even beats the ensemble ({vs_ensemble:+.4f}): "
          "the ensemble starts every 64-byte window from its prior (paxlike's: the experts' "
          "shares of the examples, here uniform) and has few bytes to find the domain, where "
          "the paper's ensemble reads 1,024-token contexts from a prior estimated on the "
          "domain's held-out data, as our weighted average's weights are.")


def why(plan: dict, results: dict, names: list[str], s: dict, failed: list[str]) -> str:
  seed = plan['seeds'][0]
  scores, random = results[('domains', seed)]['scores'], results[('random', seed)]['scores']
  diff = float(np.max(np.abs(s['ensemble'] - s['ensemble_check'])))
  parts = [_experts(s, specialization(scores['experts']), specialization(random['experts'])),
           _curve(plan, results, s), _random(s), _averages(s, scores['weights']),
           f"The per-domain scoring of the checkpoints agrees with the trainer's own eval of the "
           f"ensemble to {diff:.1e} nats/byte."]
  if failed:
    parts.append('Not met: ' + '; '.join(failed) + '.')
  return '\n\n'.join(parts)
