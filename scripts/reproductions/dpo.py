"""dpo: DPO raises held-out reward accuracy on preference pairs made from local text, and moves
the chosen and rejected completions' likelihoods as its gradient predicts (Rafailov et al. 2023);
SimPO (Meng et al. 2024) and ORPO (Hong et al. 2024) beside it.

The pairs are lm.DpoTiny's (paxlike/data/preference_synth.py): from the standard library's
source, a prompt of three lines, the chosen completion the line that follows, the rejected one
that line with its words shuffled (the same bytes). A byte LM is first trained on the library
(lm.StdlibTiny: the SFT model and the reference), then tuned from it by lm.DpoTiny with
`train.init_from`: DPO with LoRA (the adapters-off reference), DPO as a full fine-tune (the
frozen-copy reference), SimPO and ORPO (LoRA). A `probe` run trains one step at learning rate
0 so that its held-out evaluation is the SFT model's own: the reference's log-probabilities of
the held-out completions, and how often its length-normalised likelihood already prefers the
true line (SimPO's reward at step 0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from reproductions import trainer
from reproductions.page import Report

NAME, TITLE = 'dpo', 'DPO, SimPO and ORPO on preference pairs made from local text'
BASE, TUNE = 'lm.StdlibTiny', 'lm.DpoTiny'
FULL = dict(base_steps=150, steps=80, batch=8, seq_len=128, eval_every=20, eval_batches=8,
            eval_batch=16, lr=2e-3, model={})
QUICK = dict(base_steps=2, steps=2, batch=2, seq_len=128, eval_every=2, eval_batches=1,
             eval_batch=4, lr=2e-3, model={'model.num_layers': 1},  # Every run one layer.
             probe_as='simpo')  # See `runs`.
# Each method's loss settings: DPO's beta as TRL's default; SimPO's as the paper's range
# (beta 2, gamma / beta 0.5); ORPO's lambda as the paper's 0.1.
METHODS = {'dpo': dict(kind='dpo', beta=0.1, lora=True),
           'dpo_full': dict(kind='dpo', beta=0.1, lora=False),
           'simpo': dict(kind='simpo', beta=2.0, gamma=1.0, lora=True),
           'orpo': dict(kind='orpo', beta=0.1, lora=True)}
WELL_ABOVE = 0.75  # Held-out reward accuracy that counts as well above the 0.5 tie.
NOT_ABOVE = 0.6    # At or below this, DPO did not learn the preference.


def evals(rows: Sequence[dict]) -> list[dict]:
  """The rows with held-out metrics."""
  return [row for row in rows if 'eval_rewards/accuracies' in row]


def log_ratios(rows: Sequence[dict], reference: dict) -> list[tuple[int, float, float]]:
  """(step, chosen, rejected) mean held-out log-ratios log pi(y|x) - log pi_ref(y|x) of each eval
  row, from the run's and the reference's (the probe's) mean log-probabilities of the same
  held-out completions."""
  return [(row['step'], row['eval_logps/chosen'] - reference['eval_logps/chosen'],
           row['eval_logps/rejected'] - reference['eval_logps/rejected']) for row in evals(rows)]


def verdict(accuracy: float, margins: tuple[float, float], chosen: float, rejected: float
            ) -> tuple[str, list[str]]:
  """(verdict, failed conditions) from DPO's final held-out reward accuracy, its first and last
  held-out margins (chosen minus rejected log-ratio) and its final mean chosen and rejected
  log-ratios. Reproduced: accuracy at least WELL_ABOVE, the margin grew, the rejected
  completion's likelihood fell below the reference's and moved further than the chosen's (what
  DPO's gradient predicts when the rejected completion is the less likely one: see `dpo_page`).
  Not: accuracy at most NOT_ABOVE or no margin gained. Else partly."""
  first, last = margins
  if accuracy <= NOT_ABOVE or not last > 0:
    return 'not', [f'held-out reward accuracy above {NOT_ABOVE:g} with a positive margin']
  failed = []
  if accuracy < WELL_ABOVE:
    failed.append(f'held-out reward accuracy at least {WELL_ABOVE:g}')
  if not last > first:
    failed.append('the held-out margin grows')
  if not rejected < 0:
    failed.append("the rejected completion's likelihood falls below the reference's")
  if not abs(rejected) > abs(chosen):
    failed.append("the rejected completion's log-ratio moves further than the chosen's")
  return ('reproduced' if not failed else 'partly'), failed


def _overrides(plan: dict, base: Path, method: dict | None) -> dict:
  """A tuning run's CLI overrides: `method` None is the probe (SimPO at learning rate 0, one
  step: its evaluation is the SFT model's)."""
  fields = {'train.init_from': f'job:{base}', 'data.batch_size': plan['batch'],
            'data.seq_len': plan['seq_len'], 'data.eval_batch_size': plan['eval_batch'],
            'data.num_eval_batches': plan['eval_batches'],
            'train.num_steps': plan['steps'], 'train.eval_every': plan['eval_every'],
            'train.log_every': plan['eval_every'], 'train.checkpoint_every': 100_000,
            'optimizer.learning_rate.peak_value': plan['lr']}
  if method is None:
    return {**fields, 'loss.kind': 'simpo', 'loss.beta': 1.0, 'train.num_steps': 1,
            'optimizer.learning_rate.peak_value': 0.0}
  fields.update({'loss.kind': method['kind'], 'loss.beta': method['beta']})
  if 'gamma' in method:
    fields['loss.gamma'] = method['gamma']
  if not method['lora']:
    fields['model.lora_rank'] = 0
  return fields


def runs(plan: dict, work: Path) -> list[tuple[str, str, dict]]:
  """(name, experiment, overrides) of every run, in order: the SFT model, the probe, then
  each method of METHODS. With `plan['probe_as']` (the quick plan) there is no probe run:
  that method's run also evaluates after its first step, which the schedule's warm-up from 0
  takes at learning rate 0 (`run` checks it), and that evaluation is the probe's. Its beta and
  gamma change no log-probability and no accuracy (beta > 0 scales both rewards)."""
  base = work / 'base'
  out = [('base', BASE, {'train.num_steps': plan['base_steps'],
                         'train.eval_every': plan['base_steps'],
                         'train.log_every': plan['base_steps'],
                         'train.checkpoint_every': plan['base_steps']})]
  if not plan.get('probe_as'):
    out.append(('probe', TUNE, _overrides(plan, base, None)))
  for name, method in METHODS.items():
    first = {'train.eval_every': 1, 'train.log_every': 1} if name == plan.get('probe_as') else {}
    out.append((name, TUNE, {**_overrides(plan, base, method), **first}))
  return [(name, exp, {**plan['model'], **overrides}) for name, exp, overrides in out]


def run(quick: bool, work: Path) -> Report:
  plan = QUICK if quick else FULL
  rows = {name: trainer.train(exp, work / name, overrides)
          for name, exp, overrides in runs(plan, work)}
  if plan.get('probe_as'):  # The probe: that run's rows up to its first evaluation.
    method = rows[plan['probe_as']]
    first = next(i for i, row in enumerate(method) if 'eval_rewards/accuracies' in row)
    rows['probe'] = method[:first + 1]
    if rows['probe'][-1].get('learning_rate') != 0:
      raise RuntimeError(f"the probe's first step trained (learning rate "
                         f"{rows['probe'][-1].get('learning_rate')}): it is not the SFT model")
  from reproductions import dpo_page
  return dpo_page.report(quick, plan, rows)
