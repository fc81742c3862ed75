"""The diloco reproduction's page: its text, tables and plot from the measured numbers."""

from __future__ import annotations

import math
from typing import Any, Callable

from reproductions.page import Report

PAPER = ('Douillard, Feng, Rusu, Chhaparia, Donchev, Kuncoro, Ranzato, Szlam, Shen. *DiLoCo: '
         'Distributed Low-Communication Training of Language Models*, 2023 (Table 2, and its '
         'ablations of H and of the outer optimizer).')
CLAIM = """\
k workers each take H inner AdamW steps on their own data, then one outer step applies
Nesterov momentum to the mean of their parameter changes. From a shared pretrained
checkpoint and at equal inner steps, with k = 8 workers on non-IID shards of C4 (a
150M-parameter transformer, H = 500), Table 2's perplexities: **baseline (one worker)
16.23 > 8× batch data parallelism 15.30 ≈ DiLoCo 15.02 > 8× updates 14.72**: DiLoCo matches
the synchronous run of the same compute while communicating 500× less. Its perplexity grows
only mildly as H grows (from H = 50 to 2,000 all stay well below the baseline), and the
outer Nesterov beats the outer SGD at lr 1 (FedAvg) and the outer Adam."""
NAMES = {'baseline': 'baseline (1 worker, batch B)', 'batch': 'k× batch data parallel',
         'updates': 'k× updates (batch B, kT steps)', 'diloco': 'DiLoCo'}


def _setting(quick: bool, plan: dict, params: int | None) -> str:
  size = ('`--quick`: a 1-layer, 32-wide LM, a few steps, no warm-up, one seed, no ablations: '
          'a smoke test of the pipeline, whose numbers mean nothing.\n\n' if quick else '')
  k, t, h, b = plan['k'], plan['steps'], plan['h'], plan['batch']
  model = ', '.join(f'{key.split(".")[1]} {v}' for key, v in plan['model'].items())
  return size + f"""\
Theirs: C4 (SentencePiece tokens), a 150M-parameter Chinchilla-style transformer, 24k steps
of shared pretraining, then 64k inner steps per worker with 8 workers on 8 clusters of C4
(non-IID), batch 512 × 1,024 tokens per worker, inner AdamW with a cosine schedule, outer
Nesterov (lr 0.7, momentum 0.9), H = 500 (128 outer steps); perplexity on C4's validation set.

Ours: Tiny Shakespeare bytes (perplexity per byte, exp of `eval_loss`), paxlike's byte
TransformerLM with {model} ({f'{params:,}' if params else 'a few thousand'} parameters),
sequences of {plan['seq_len']} bytes, inner AdamW at a constant 3e-3 clipped at norm 1 (the
experiments' own). A shared warm-up of {plan['warmup']} steps at batch {b}
(`federated.ShakespeareCentralized --fdl_set=data.batch_size={b}`); from its checkpoint
(`train.init_from=job:...`, params only, so every run starts a fresh AdamW state), T = {t}
inner steps per worker: baseline batch B = {b}; {k}× batch = {k * b}; {k}× updates =
{k * t} steps at batch {b} (the baseline is this run at step {t}); DiLoCo
(`federated.ShakespeareDiLoCo`): k = {k} replicas, each on one of 4 domains of speaking
roles (contiguous runs of plays, `data.partition=domains`, fixed to its replica: non-IID),
batch {b} each, H = {h} ({t // h} rounds), outer Nesterov lr 0.7, momentum 0.9. Ablations
(seed {plan['seeds'][0]}): H ∈ {{{', '.join(str(x) for x in plan['hs'])}}}; outer SGD at lr 1
without momentum (FedAvg's server; DiLoCo still keeps each replica's inner AdamW state across
rounds); outer Adam (β 0.9/0.99) at lr ∈
{{{', '.join(f'{x:g}' for x in plan['adam_lrs']) or '–'}}} (the best is kept). Data-order seeds
(`train.seed`): {', '.join(str(s) for s in plan['seeds'])} for the four main runs. Eval: the
same {plan['eval_batches']} × 16 windows of the pooled test split for every run."""


def main_table(plan: dict, ppl: dict, per_seed: dict) -> tuple[str, list, list]:
  """Table 2's rows: communication, time, compute, perplexity per seed, mean, paper."""
  from reproductions.diloco import PAPER as PAPER_PPL
  k, t, h = plan['k'], plan['steps'], plan['h']
  comm = {'baseline': '0', 'batch': f'{t} all-reduces', 'updates': '0',
          'diloco': f'{t // h} outer steps ({h}× fewer)'}
  cost = {'baseline': ('1×', '1×'), 'batch': ('1×', f'{k}×'), 'updates': (f'{k}×', f'{k}×'),
          'diloco': ('1×', f'{k}×')}
  header = ['', 'communication', 'time', 'compute & data',
            *(f'ppl seed {s}' for s in plan['seeds']), 'ppl (mean)', 'paper ppl (k = 8)']
  rows = [[NAMES[m], comm[m], *cost[m], *(f'{per_seed[(m, s)]:.4f}' for s in plan['seeds']),
           f'{ppl[m]:.4f}', PAPER_PPL[m]] for m in ('baseline', 'batch', 'diloco', 'updates')]
  return (f'At T = {t} inner steps per worker after the warm-up (byte perplexity).', header,
          rows)


def h_table(plan: dict, by_h: dict, baseline: float) -> tuple[str, list, list]:
  rows = [[h, plan['steps'] // h, f'{h}×', f'{p:.4f}', f'{100 * (p / baseline - 1):+.1f}%']
          for h, p in sorted(by_h.items())]
  return (f'DiLoCo by communication period H (seed {plan["seeds"][0]}), at T = '
          f'{plan["steps"]} inner steps.', ['H', 'rounds', 'less communication', 'ppl',
                                            'vs baseline'], rows)


def outer_table(plan: dict, by_outer: dict, nesterov: dict, adam: dict
                ) -> tuple[str, list, list]:
  rows = [[f'Nesterov (lr {lr:g}, momentum 0.9)', f'{p:.4f}'] for lr, p in nesterov.items()]
  rows += [['SGD (lr 1: FedAvg)', f'{by_outer["sgd"]:.4f}']]
  rows += [[f'Adam (lr {lr:g})', f'{p:.4f}'] for lr, p in sorted(adam.items())]
  return (f'DiLoCo by outer optimizer (H = {plan["h"]}, seed {plan["seeds"][0]}); the verdict '
          'takes the best rate of Nesterov and of Adam.', ['outer optimizer', 'ppl'], rows)


def diagnostic_ppl(plan: dict, runs: dict) -> dict[float, dict[str, float]]:
  """The main comparison's perplexities at each diagnostic inner rate (seed one)."""
  from reproductions.diloco import final
  t, k = plan['steps'], plan['k']
  return {lr: {'baseline': final(runs[('lr', lr, 'updates')], t),
               'batch': final(runs[('lr', lr, 'batch')], t),
               'diloco': final(runs[('lr', lr, 'diloco')], t),
               'updates': final(runs[('lr', lr, 'updates')], k * t)}
          for lr in plan.get('diagnostic_lrs', ())}


def diagnostic_table(plan: dict, per_seed: dict, diag: dict) -> tuple[str, list, list]:
  seed = plan['seeds'][0]
  header = ['', f'inner lr 3e-3 (seed {seed})', *(f'inner lr {lr:g} (seed {seed})'
                                                   for lr in diag)]
  rows = [[NAMES[m], f'{per_seed[(m, seed)]:.4f}', *(f'{d[m]:.4f}' for d in diag.values())]
          for m in ('baseline', 'batch', 'diloco', 'updates')]
  return ('Diagnostic: the main comparison at a lower inner rate (the same warm-up, T and H).',
          header, rows)


def small_h_table(plan: dict, by_h: dict, small: dict) -> tuple[str, list, list]:
  h = min(plan['hs'])
  rows = [['Nesterov (lr 0.7, momentum 0.9)', f'{by_h[h]:.4f}']]
  rows += [[{'sgd': 'SGD (lr 1: FedAvg)'}.get(label, label.replace('nesterov', 'Nesterov (lr ')
            + ', momentum 0.9)'), f'{p:.4f}'] for label, p in small.items()]
  return (f'Diagnostic: DiLoCo at H = {h} by outer optimizer (seed {plan["seeds"][0]}).',
          ['outer optimizer', 'ppl'], rows)


def _curve(rows: list[dict]) -> tuple[list[int], list[float]]:
  points = [(r.get('inner_step', r['step']), math.exp(r['eval_loss'])) for r in rows
            if 'eval_loss' in r]
  return [s for s, _ in points], [p for _, p in points]


def _plot(plan: dict, runs: dict, by_h: dict, by_outer: dict, ppl: dict
          ) -> Callable[[Any], None]:
  seed = plan['seeds'][0]

  def draw(figure) -> None:
    axes = figure.subplots(1, 3 if len(by_outer) > 1 else 2)
    for method in ('updates', 'batch', 'diloco'):
      steps, values = _curve(runs[(method, seed)])
      axes[0].plot(steps, values, label=NAMES['baseline' if method == 'updates' else method]
                   + (' → k× updates' if method == 'updates' else ''))
    axes[0].axvline(plan['steps'], color='grey', linestyle=':', linewidth=1)
    axes[0].set(xlabel='inner steps per worker after warm-up', ylabel='eval perplexity (bytes)',
                title=f'seed {seed}', yscale='log')
    axes[0].legend(fontsize=7)
    hs = sorted(by_h)
    axes[1].semilogx(hs, [by_h[h] for h in hs], 'o-', label='DiLoCo', base=2)
    for method, style in (('baseline', ':'), ('batch', '--'), ('updates', '-.')):
      axes[1].axhline(ppl[method], color='grey', linestyle=style, label=NAMES[method])
    axes[1].set(xlabel='H (inner steps per round)', ylabel=f'ppl at T = {plan["steps"]}',
                title='communication period')
    axes[1].legend(fontsize=6)
    if len(by_outer) > 1:
      names = list(by_outer)
      axes[2].bar(names, [by_outer[n] for n in names], color='tab:blue')
      low = min(by_outer.values())
      axes[2].set(ylim=(low * 0.98, max(by_outer.values()) * 1.01), ylabel='ppl',
                  title='outer optimizer')
  return draw


def report(quick: bool, plan: dict, runs: dict) -> Report:
  """The diloco page's Report."""
  from reproductions.diloco import NAME, TITLE, final, verdict
  t, k, seeds, first = plan['steps'], plan['k'], plan['seeds'], plan['seeds'][0]
  per_seed = {}
  for s in seeds:
    per_seed[('baseline', s)] = final(runs[('updates', s)], t)
    per_seed[('updates', s)] = final(runs[('updates', s)], k * t)
    per_seed[('batch', s)] = final(runs[('batch', s)], t)
    per_seed[('diloco', s)] = final(runs[('diloco', s)], t)
  ppl = {m: sum(per_seed[(m, s)] for s in seeds) / len(seeds)
         for m in ('baseline', 'batch', 'diloco', 'updates')}
  by_h = {plan['h']: per_seed[('diloco', first)],
          **{h: final(runs[('h', h)], t) for h in plan['hs'] if h != plan['h']}}
  adam = {lr: final(runs[('adam', lr)], t) for lr in plan['adam_lrs']}
  nesterov = {0.7: per_seed[('diloco', first)],
              **{lr: final(runs[('nesterov', lr)], t) for lr in plan.get('nesterov_lrs', ())}}
  by_outer = {'nesterov': min(nesterov.values())}
  if ('outer', 'sgd') in runs:
    by_outer['sgd'] = final(runs[('outer', 'sgd')], t)
  if adam:
    by_outer['adam'] = min(adam.values())
  result, failed = verdict(ppl, by_h, by_outer)
  diag = diagnostic_ppl(plan, runs)
  small = {label: final(runs[('small_h', label)], t) for label in plan.get('small_h_outer', {})}
  summary = (', '.join(f'{m} {ppl[m]:.3f}' for m in ('baseline', 'batch', 'diloco', 'updates'))
             + f' (byte perplexity, mean of {len(seeds)} seeds; paper 16.23 / 15.30 / 15.02 / '
             '14.72)' + (f'; failed: {"; ".join(failed)}' if failed else '') + '.')
  numbers = {'perplexity': ppl, 'perplexity_by_h': by_h, 'perplexity_by_outer': by_outer,
             'nesterov_by_lr': nesterov, 'adam_by_lr': adam, 'diagnostic_by_inner_lr': diag,
             'diagnostic_small_h_by_outer': small, 'failed': failed}
  tables = [main_table(plan, ppl, per_seed)]
  if len(by_h) > 1:
    tables.append(h_table(plan, by_h, ppl['baseline']))
  if len(by_outer) > 1:
    tables.append(outer_table(plan, by_outer, nesterov, adam))
  if diag:
    tables.append(diagnostic_table(plan, per_seed, diag))
  if small:
    tables.append(small_h_table(plan, by_h, small))
  from reproductions.diloco_why import why
  params = None if quick else parameter_count(plan)  # Quick: no jax import for it.
  return Report(NAME, TITLE, PAPER, CLAIM, _setting(quick, plan, params), result, summary,
                why(plan, ppl, per_seed, by_h, by_outer, nesterov, adam, diag, small,
                    failed), tables,
                numbers,
                _plot(plan, runs, by_h, by_outer, ppl))


def parameter_count(plan: dict) -> int:
  """The LM's parameter count: `lm_tiny` (ShakespeareCentralized's and ShakespeareDiLoCo's
  model) with the plan's model overrides, by paxlike's own shape count."""
  import fiddle as fdl
  from paxlike.configs import models
  from paxlike.families.shapes import param_count
  cfg = models.lm_tiny()
  for path, value in plan['model'].items():
    setattr(cfg, path.split('.', 1)[1], value)
  return param_count(fdl.build(cfg))
