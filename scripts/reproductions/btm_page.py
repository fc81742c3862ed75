"""The btm reproduction's page: its text, tables and plot from the measured numbers."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from reproductions import trainer
from reproductions.page import Report

PAPER = ('Li, Gururangan, Dettmers, Lewis, Althoff, Smith, Zettlemoyer. *Branch-Train-Merge: '
         'Embarrassingly Parallel Training of Expert Language Models*, 2022 (arXiv:2208.03306).')
CLAIM = """\
Train a seed LM on all the data, branch one copy per domain, train each copy (an expert LM,
ELM) on its own domain with no communication, and keep the set (an ELMForest). **Ensembled
by the domain posterior** (each expert weighted by how well it has predicted the context so
far), the experts **beat a GPT-style dense transformer trained with the same compute** on the
same domains (in- and out-of-domain perplexity, 125M to 1.3B parameters per expert, 8
training domains). The gain **needs domain specialization: ensembles of experts trained on
random splits of the data do not perform well**. The experts can also be collapsed back into
one LM by averaging their parameters; **weighting the average by the target domain's
posterior** beats the uniform average (which mixes the experts' knowledge away)."""
LABELS = {'dense': 'dense, equal compute', 'ensemble': 'domain experts: posterior ensemble',
          'own_expert': "domain experts: the domain's own expert",
          'merged': 'domain experts: average by size (trainer)',
          'uniform': 'domain experts: uniform average',
          'weighted': 'domain experts: posterior-weighted average',
          'random_ensemble': 'random-split experts: posterior ensemble',
          'random_uniform': 'random-split experts: uniform average',
          'random_weighted': 'random-split experts: posterior-weighted average'}


def _setting(quick: bool, plan: dict) -> str:
  size = ('`--quick`: a 1-layer 32-wide LM, 2 rounds per run: a smoke test of the pipeline, '
          'whose numbers mean nothing.\n\n' if quick else '')
  tokens = plan['local_steps'] * plan['batch'] * plan['seq_len']
  expert_rounds = plan['rounds'] - plan['seed_rounds']
  text = size + f"""\
Theirs: 8 training domains (e.g. 1B words, CS and legal papers, medical text, web text, news,
Reddit, reviews), transformer LMs of 125M–1.3B parameters, a seed LM trained on all domains
and then one expert per domain; the dense baseline trained with the compute of the whole
ELMForest; perplexity on each domain's held-out text; the posterior estimated from a few
held-out sequences of the target domain.

Ours: `federated.ShakespeareBtm` (paxlike.federated.btm) through the CLI with overrides
(`python -m paxlike.main --exp=federated.ShakespeareBtm --fdl_set=algorithm.seed_steps=...`):
the 2-layer byte LM (`paxlike.configs.models.lm_tiny`, ~0.4M parameters{', shrunk' if quick else ''})
on Tiny Shakespeare's {4} domains (roles in order of first appearance cut into near-equal
runs, i.e. stretches of plays; `data.partition=domains`), AdamW at a constant lr
{plan['lr']:g}, {plan['local_steps']} steps of {plan['batch']} windows of {plan['seq_len']}
bytes per slot and round. BTM: {plan['seed_rounds']} seed rounds (one model, each step on all
4 slots' batches together: {4 * tokens:,} bytes a round), then {expert_rounds} rounds of 4
experts, each on its own domain ({tokens:,} bytes each a round). Dense, equal compute: the
same job with all {plan['rounds']} rounds seed rounds (`algorithm.seed_steps={plan['rounds']}`):
the same bytes, steps and FLOPs. Random split: BTM on 4 clients of documents dealt at random
(`data.partition=iid`). Scores: nats per byte on each domain's held-out speeches (the whole
test split, tiled into windows; `data.num_eval_batches=None`), seeds
{', '.join(map(str, plan['seeds']))}. The dense model's and the domain ensemble's are the
trainer's per-domain eval (`eval_clients.jsonl`); the rest come from scoring the final
checkpoint's experts with paxlike's model and ensemble (scripts/reproductions/btm_eval.py),
whose ensemble agrees with the trainer's (table below). Posterior weights: p(expert | window)
averaged over 32 evenly spaced held-out windows of the target domain (of its ~400)."""
  if plan['long']:
    text += (f" The diagnostic: the dense and the domain-expert runs again, {plan['long']}× as "
             f"long ({plan['rounds'] * plan['long']} rounds, "
             f"{plan['seed_rounds'] * plan['long']} of them seed rounds for BTM).")
  return text


def _row(label: str, values: np.ndarray, dense: np.ndarray | None) -> list:
  gain = '–' if dense is None else f'{np.mean(dense - values):+.4f}'
  return [label, *(f'{v:.4f}' for v in values), f'{np.mean(values):.4f}', gain]


def results_table(names: list[str], s: dict) -> tuple[str, list, list]:
  header = ['model', *names, 'mean', 'gain over dense']
  rows = [_row(LABELS['dense'], s['dense'], None)]
  rows += [_row(LABELS[k], s[k], s['dense']) for k in LABELS if k != 'dense']
  return ('Held-out loss (nats per byte) on each domain; gain = dense minus the model, '
          'mean over domains (positive: better than dense).', header, rows)


def experts_table(names: list[str], results: dict, seed: int) -> tuple[str, list, list]:
  scores = results[('domains', seed)]['scores']
  header = ['expert (trained on)', *names]
  rows = [[f'expert {k} ({names[k]})', *(f'{v:.4f}' for v in scores['experts'][k])]
          for k in range(len(names))]
  rows += [[f'posterior weights for {names[d]}', *(f'{w:.2f}' for w in scores['weights'][d])]
           for d in range(len(names))]
  return (f'Domain experts (seed {seed}): each expert\'s loss on each domain, and each domain\'s '
          'posterior weights over the experts.', header, rows)


def length_table(plan: dict, s: dict) -> tuple[str, list, list]:
  header = ['rounds (seed rounds)', 'dense, equal compute', 'domain experts: posterior ensemble',
            'gain over dense']
  rows = []
  for scale, dense, ours in ((1, s['dense'], s['ensemble']),
                             (plan['long'], s['dense_long'], s['ensemble_long'])):
    rows.append([f"{plan['rounds'] * scale} ({plan['seed_rounds'] * scale})",
                 f'{np.mean(dense):.4f}', f'{np.mean(ours):.4f}',
                 f'{np.mean(dense - ours):+.4f}'])
  return (f"The diagnostic: the dense model and the domain experts trained {plan['long']}× as "
          'long (the same seed share): held-out loss, mean over domains.', header, rows)


def check_table(names: list[str], s: dict) -> tuple[str, list, list]:
  header = ['posterior ensemble of the domain experts', *names]
  rows = [['the trainer (eval_clients.jsonl)', *(f'{v:.5f}' for v in s['ensemble'])],
          ['btm_eval (from the checkpoint)', *(f'{v:.5f}' for v in s['ensemble_check'])]]
  return ('The scoring agrees with the trainer\'s eval.', header, rows)


def _plot(plan: dict, results: dict, names: list[str], s: dict) -> Callable[[Any], None]:
  def draw(figure) -> None:
    left, right = figure.subplots(1, 2)
    seed = plan['seeds'][0]
    curves = [('dense', 'eval_loss', LABELS['dense']),
              ('domains', 'eval_loss', 'domain experts: average by size'),
              ('domains', 'eval_ensemble_loss', LABELS['ensemble']),
              ('random', 'eval_ensemble_loss', LABELS['random_ensemble'])]
    if plan['long']:
      curves += [('dense_long', 'eval_loss', f"dense, {plan['long']}× as long"),
                 ('domains_long', 'eval_ensemble_loss',
                  f"domain experts' ensemble, {plan['long']}× as long")]
    for kind, key, label in curves:
      steps, loss = trainer.series(results[(kind, seed)]['rows'], key)
      left.plot(steps, loss, label=label, marker='.', ls='--' if 'long' in kind else '-')
    for branch in {plan['seed_rounds'], plan['seed_rounds'] * (plan['long'] or 1)}:
      left.axvline(branch, color='k', lw=0.5, ls=':')
    left.set(xlabel='round (dotted: the experts branch; dashed: trained longer)',
             ylabel='held-out loss (nats/byte)',
             title=f'all domains, seed {seed}')
    left.legend(fontsize=7)
    keys = ['ensemble', 'own_expert', 'uniform', 'weighted', 'random_ensemble', 'random_weighted']
    x = np.arange(len(names))
    for i, key in enumerate(keys):
      right.bar(x + (i - 2.5) * 0.13, s['dense'] - s[key], 0.13, label=LABELS[key])
    right.axhline(0, color='k', lw=0.5)
    right.set_xticks(x, [n.split('..')[0] + '..' for n in names], fontsize=7)
    right.set(ylabel='nats/byte better than dense', title='per domain')
    right.legend(fontsize=6, loc='upper center', bbox_to_anchor=(0.5, -0.1), ncol=2)
  return draw


def report(quick: bool, plan: dict, results: dict) -> Report:
  """The btm page's Report."""
  from reproductions.btm import NAME, TITLE, summary, verdict
  from reproductions.btm_why import why
  s = summary(plan, results)
  names = results[('domains', plan['seeds'][0])]['scores']['domains']
  result, failed = verdict(s['dense'], s['ensemble'], s['random_ensemble'], s['uniform'],
                           s['weighted'])
  mean = {k: float(np.mean(v)) for k, v in s.items()}
  line = (f"held-out loss, mean over domains: dense {mean['dense']:.4f}, domain experts' "
          f"posterior ensemble {mean['ensemble']:.4f} "
          f"({mean['dense'] - mean['ensemble']:+.4f} nats/byte), random-split experts' "
          f"{mean['random_ensemble']:.4f} ({mean['dense'] - mean['random_ensemble']:+.4f}); "
          f"parameter averages: posterior-weighted {mean['weighted']:.4f} vs uniform "
          f"{mean['uniform']:.4f}")
  summary_line = line + (f' (failed: {"; ".join(failed)})' if failed else '') + '.'
  numbers = {**{k: round(v, 4) for k, v in mean.items() if k != 'ensemble_check'},
             'failed': failed}
  tables = [results_table(names, s), experts_table(names, results, plan['seeds'][0]),
            *([length_table(plan, s)] if plan['long'] else []), check_table(names, s)]
  return Report(NAME, TITLE, PAPER, CLAIM, _setting(quick, plan), result, summary_line,
                why(plan, results, names, s, failed), tables, numbers,
                _plot(plan, results, names, s))
