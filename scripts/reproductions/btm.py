"""btm: domain experts branched from a seed vs a dense model of equal compute (Li et al. 2022,
Branch-Train-Merge).

Every run is `federated.ShakespeareBtm` (paxlike.federated.btm: a seed LM trained on the pooled
slots' batches for `seed_steps` rounds, then one expert per slot, each on its own data) through
the CLI with `--fdl_set` overrides, on Tiny Shakespeare's 4 domains (runs of plays, by role):
- `dense`: all rounds are seed rounds (`algorithm.seed_steps` = the rounds): one model on all
  domains, a step on the 4 slots' batches together, the same tokens and FLOPs as BTM's;
- `domains`: the seed for `seed` rounds, then 4 experts, expert k on domain k;
- `random`: the same on a random split (`data.partition=iid`: documents dealt to 4 clients);
- `dense_long`, `domains_long` (the diagnostic): `dense` and `domains` trained `long` times as
  long, seed rounds scaled alike, to see whether the gap closes as the learning curve flattens.
Scores are nats per byte on each domain's held-out speeches (the test split tiled): the
trainer's per-domain eval (eval_clients.jsonl) for the dense model and the domain experts'
posterior ensemble, and btm_eval's scoring of the final experts for the rest (each expert per
domain, the random split per domain, parameter averages: uniform, and weighted by each domain's
posterior).
"""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from reproductions import trainer
from reproductions.page import Report

NAME, TITLE = 'btm', 'Branch-Train-Merge: domain experts vs a dense model of equal compute'
EXP = 'federated.ShakespeareBtm'
RUNS = ('dense', 'domains', 'random')
LONG = ('dense_long', 'domains_long')  # The diagnostic: both trained `long` times as long.
FULL = dict(rounds=150, seed_rounds=50, local_steps=4, batch=8, seq_len=64, lr=3e-3,
            eval_every=25, eval_batch=16, seeds=(0,), model={}, workers=2, long=2)
QUICK = dict(rounds=2, seed_rounds=1, local_steps=1, batch=4, seq_len=128, lr=3e-3,
             eval_every=2, eval_batch=64, seeds=(0,), workers=1, long=None,
             model={'num_layers': 1, 'd_model': 32, 'num_heads': 2, 'd_ff': 64})
# The quick runs one at a time: run side by side, dense and domains each compiled the programs
# they share (init_state) before either had cached it, and the suite's workers fill the cores.
DOMAINS = 4
MIN_NATS = 0.01  # "Beats": lower by at least 0.01 nats per byte (1% perplexity) on average.


def verdict(dense: Sequence[float], ensemble: Sequence[float], random: Sequence[float],
            uniform: Sequence[float], weighted: Sequence[float]) -> tuple[str, list[str]]:
  """(verdict, failed conditions) from per-domain losses (nats per byte): the dense model, the
  domain experts' posterior ensemble, the random-split experts' ensemble, and the domain
  experts' uniform and posterior-weighted parameter averages. Reproduced: the domain ensemble
  beats the dense model by MIN_NATS on average and on every domain; the random-split ensemble
  does not (gains under MIN_NATS); the weighted average beats the uniform one by MIN_NATS.
  Not: the domain ensemble does not beat the dense model on average. Else partly."""
  gain = lambda a, b: float(np.mean(np.subtract(a, b)))
  if not gain(dense, ensemble) > 0:
    return 'not', ['the domain experts\' ensemble beats the dense model']
  failed = []
  if gain(dense, ensemble) < MIN_NATS or not all(d > e for d, e in zip(dense, ensemble)):
    failed.append(f'the domain experts\' ensemble beats the dense model by {MIN_NATS:g} nats '
                  'on average and on every domain')
  if gain(dense, random) >= MIN_NATS:
    failed.append('the random-split experts\' ensemble does not beat the dense model')
  if gain(uniform, weighted) < MIN_NATS:
    failed.append('the posterior-weighted parameter average beats the uniform one')
  return ('reproduced' if not failed else 'partly'), failed


def _overrides(plan: dict, kind: str, seed: int) -> dict:
  """The CLI overrides of one run: `kind` in RUNS or LONG (rounds and seed rounds × long)."""
  scale = plan['long'] if kind in LONG else 1
  rounds, seed_rounds = plan['rounds'] * scale, plan['seed_rounds'] * scale
  fields = {'algorithm.seed_steps': rounds if kind.startswith('dense') else seed_rounds,
            'data.local_steps': plan['local_steps'], 'data.batch_size': plan['batch'],
            'data.seq_len': plan['seq_len'], 'data.num_eval_batches': None,
            'data.eval_batch_size': plan['eval_batch'],
            'optimizer.learning_rate': plan['lr'], 'train.seed': seed,
            'train.num_steps': rounds, 'train.eval_every': plan['eval_every'] * scale,
            'train.log_every': plan['eval_every'] * scale, 'train.checkpoint_every': 100_000,
            **{f'model.{k}': v for k, v in plan['model'].items()}}
  if kind == 'random':
    fields.update({'data.partition': 'iid', 'data.partition_seed': seed})
  return fields


def domain_table(job: Path) -> dict[str, dict[str, float]]:
  """The trainer's per-domain eval at the run's last eval (eval_clients.jsonl)."""
  lines = (job / 'eval_clients.jsonl').read_text().splitlines()
  return json.loads(lines[-1])['clients']


def run(quick: bool, work: Path) -> Report:
  from reproductions import btm_page
  plan = QUICK if quick else FULL
  kinds = (LONG if plan['long'] else ()) + RUNS  # The longest first, for the two workers.
  specs = [(f'{kind}_s{seed}', kind, seed) for seed in plan['seeds'] for kind in kinds]

  def one(spec: tuple[str, str, int]) -> tuple[str, int, dict]:
    """Trains one run, then reads its per-domain eval and scores its experts (the scoring of
    one run overlaps the training of the next)."""
    name, kind, seed = spec
    job = work / name
    out = {'rows': trainer.train(EXP, job, _overrides(plan, kind, seed))}
    if kind != 'random':
      out['table'] = domain_table(job)
    if kind in ('domains', 'random'):
      out['scores'] = expert_scores(job)
    return kind, seed, out

  with concurrent.futures.ThreadPoolExecutor(plan['workers']) as pool:  # Each run: a process.
    results = {(kind, seed): out for kind, seed, out in pool.map(one, specs)}
  return btm_page.report(quick, plan, results)


def expert_scores(job: Path) -> dict:
  """btm_eval.score of the job's experts, kept beside its job dir (JOB.scores.npz, the arrays
  as computed); with `trainer.REUSE['on']`, that file when a previous call wrote it, as
  trainer.cli_output reuses a decode: --reuse redoes the page without scoring again."""
  from reproductions import btm_eval
  path = job.parent / f'{job.name}.scores.npz'
  if trainer.REUSE['on'] and path.exists():
    with np.load(path) as saved:
      return {k: saved[k].tolist() if k == 'domains' else saved[k] for k in saved.files}
  trainer.log(f'scoring {job.name}\'s experts per domain')
  out = btm_eval.score(job)
  np.savez(path, **out)
  return out


def summary(plan: dict, results: dict) -> dict[str, np.ndarray]:
  """Per-domain losses [domains], averaged over seeds, of every model the page compares."""
  seeds, out = plan['seeds'], {}
  names = results[('domains', seeds[0])]['scores']['domains']
  column = lambda kind, key, s: np.array([results[(kind, s)]['table'][n][key] for n in names])
  mean = lambda f: np.mean([f(s) for s in seeds], axis=0)
  out['dense'] = mean(lambda s: column('dense', 'loss', s))
  out['ensemble'] = mean(lambda s: column('domains', 'ensemble_loss', s))
  out['merged'] = mean(lambda s: column('domains', 'loss', s))
  scores = lambda kind, key: mean(lambda s: results[(kind, s)]['scores'][key])
  out['own_expert'] = mean(lambda s: np.diag(results[('domains', s)]['scores']['experts']))
  for key in ('ensemble', 'uniform', 'weighted'):
    out[f'random_{key}'] = scores('random', key)
  out['uniform'], out['weighted'] = scores('domains', 'uniform'), scores('domains', 'weighted')
  out['ensemble_check'] = scores('domains', 'ensemble')  # btm_eval's own, against the trainer's.
  if plan['long']:
    out['dense_long'] = mean(lambda s: column('dense_long', 'loss', s))
    out['ensemble_long'] = mean(lambda s: column('domains_long', 'ensemble_loss', s))
  return out
