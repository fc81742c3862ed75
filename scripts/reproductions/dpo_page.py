"""The dpo reproduction's page: its text, tables and plot from the measured numbers."""

from __future__ import annotations

from typing import Any, Callable

from reproductions import dpo
from reproductions.page import Report

PAPER = ('Rafailov, Sharma, Mitchell, Ermon, Manning, Finn. *Direct Preference Optimization: '
         'Your Language Model is Secretly a Reward Model*, NeurIPS 2023. Beside it: Meng, Xia, '
         'Chen. *SimPO: Simple Preference Optimization with a Reference-Free Reward*, 2024; '
         'Hong, Lee, Thorne. *ORPO: Monolithic Preference Optimization without Reference '
         'Model*, 2024.')
CLAIM = """\
DPO trains the policy π on pairs (x, y_w, y_l) with the loss −log σ(β (h_w − h_l)), where
h = log π(y|x) − log π_ref(y|x) is a completion's log-ratio to the reference (eq. 7); β h is
the implicit reward, and a pair is ranked right when β h_w > β h_l. Tuning raises the
held-out reward accuracy from the tie at step 0 (π = π_ref: every pair's margin is 0, counted
as 0.5) to well above it.

What the paper's analysis says of the chosen completion's likelihood. The loss sees only the
margin h_w − h_l (rewards are identified up to a prompt-only shift, §5, Theorem 1), so nothing
in the objective holds log π(y_w|x) at or above the reference's. Its gradient (§4) is
−β σ(−β Δ) (∇log π(y_w|x) − ∇log π(y_l|x)): one SGD step of size η changes h_w by
η β σ (‖g_w‖² − g_w·g_l) and h_l by −η β σ (‖g_l‖² − g_w·g_l), with g = ∇log π(y|x). So to
first order the margin always grows (by η β σ ‖g_w − g_l‖²), the chosen's likelihood rises
only if its gradient outweighs its overlap with the rejected one's, and when the rejected
completion is the less likely one (a larger gradient) it moves further than the chosen:
**h_l falls below 0 and |h_l| > |h_w|**, while h_w itself may fall. SimPO (no reference, a
length-normalised margin with a target γ) has no anchor either; ORPO adds the SFT loss on
y_w, so it should keep the chosen's likelihood rising."""


def _setting(quick: bool, plan: dict) -> str:
  size = ('`--quick`: a couple of steps per run of a 1-layer model: a smoke test of the '
          'pipeline, whose numbers mean nothing.\n\n' if quick else '')
  methods = '; '.join(f"{name}: kind {m['kind']}, β {m['beta']:g}"
                      + (f", γ {m['gamma']:g}" if 'gamma' in m else '')
                      + (', LoRA rank 8 (attention)' if m['lora'] else ', every weight')
                      for name, m in dpo.METHODS.items())
  return size + f"""\
Theirs: GPT-2 / Pythia-2.8B policies on IMDb sentiment, Anthropic HH and TL;DR summaries, the
SFT model as the reference, β 0.1–0.5.

Ours: a 2-layer byte LM (d_model 128) trained on the standard library's source for
{plan['base_steps']} steps (`python -m paxlike.main --exp={dpo.BASE}`), then tuned from it
(`--exp={dpo.TUNE} --fdl_set=train.init_from=job:BASE`) on lm.DpoTiny's 4,000 pairs (chosen:
the true next line after a 3-line prompt; rejected: that line with its words shuffled), 5%
held out: {plan['steps']} steps of {plan['batch']} pairs, seq_len {plan['seq_len']}, AdamW at
peak lr {plan['lr']:g}, held-out evaluation every {plan['eval_every']} steps on
{plan['eval_batches'] * plan['eval_batch']} pairs. Methods: {methods}. Log-ratios are the
held-out mean log-probabilities of a run minus the probe's (the SFT model's, on the same
pairs); DPO's `eval_rewards/chosen` / β gives the same numbers from the reference inside the
loss."""


def _numbers(plan: dict, rows: dict[str, list[dict]]) -> dict[str, Any]:
  """The key numbers: final held-out accuracies, DPO's margins and log-ratios, the SFT model's
  own likelihood preference, and the largest gap between the two ways of reading h."""
  reference = dpo.evals(rows['probe'])[-1]
  out: dict[str, Any] = {'sft_likelihood_accuracy': reference['eval_rewards/accuracies']}
  for name in dpo.METHODS:
    final = dpo.evals(rows[name])[-1]
    ratios = dpo.log_ratios(rows[name], reference)
    out[f'{name}_accuracy'] = final['eval_rewards/accuracies']
    out[f'{name}_chosen'], out[f'{name}_rejected'] = ratios[-1][1], ratios[-1][2]
    out[f'{name}_margins'] = (ratios[0][1] - ratios[0][2], ratios[-1][1] - ratios[-1][2])
  gaps = [abs(row[f'eval_rewards/{side}'] / dpo.METHODS['dpo']['beta'] - ratio)
          for row, (_, *pair) in zip(dpo.evals(rows['dpo']), dpo.log_ratios(rows['dpo'], reference))
          for side, ratio in zip(('chosen', 'rejected'), pair)]
  out['dpo_reward_vs_logps_gap'] = max(gaps)
  return out


def _table(rows: dict[str, list[dict]], numbers: dict) -> tuple[str, list, list]:
  header = ['method', 'step', 'held-out reward accuracy', 'margin h_w − h_l',
            'chosen h_w', 'rejected h_l', 'loss']
  reference = dpo.evals(rows['probe'])[-1]
  out = [['SFT model (probe: length-normalised likelihood)', 0,
          numbers['sft_likelihood_accuracy'], None, 0.0, 0.0, None]]
  for name in dpo.METHODS:
    for row, (step, chosen, rejected) in zip(dpo.evals(rows[name]),
                                              dpo.log_ratios(rows[name], reference)):
      out.append([name, step, row['eval_rewards/accuracies'], chosen - rejected, chosen,
                  rejected, row['eval_loss']])
  return ('Held-out pairs: reward accuracy (ties count 0.5), and the mean log-ratios to the SFT '
          'model in nats per completion', header, out)


def _plot(rows: dict[str, list[dict]]) -> Callable[[Any], None]:
  reference = dpo.evals(rows['probe'])[-1]

  def plot(figure):
    left, right = figure.subplots(1, 2)
    for index, name in enumerate(dpo.METHODS):
      color = f'C{index}'
      steps = [0] + [row['step'] for row in dpo.evals(rows[name])]
      start = 0.5 if dpo.METHODS[name]['kind'] == 'dpo' else reference['eval_rewards/accuracies']
      left.plot(steps, [start] + [row['eval_rewards/accuracies'] for row in dpo.evals(rows[name])],
                marker='o', color=color, label=name)
      ratios = dpo.log_ratios(rows[name], reference)
      steps = [0] + [s for s, _, _ in ratios]
      right.plot(steps, [0.0] + [c for _, c, _ in ratios], marker='o', color=color,
                 label=f'{name} chosen')
      right.plot(steps, [0.0] + [r for _, _, r in ratios], marker='x', linestyle='--',
                 color=color, label=f'{name} rejected')
    left.axhline(0.5, color='grey', linewidth=0.8)
    left.axhline(reference['eval_rewards/accuracies'], color='black', linestyle=':',
                 label='SFT likelihood (probe)')
    left.set(xlabel='step', ylabel='held-out reward accuracy', ylim=(0.0, 1.02))
    left.legend()
    right.axhline(0.0, color='grey', linewidth=0.8)
    right.set(xlabel='step', ylabel='log π(y|x) − log π_SFT(y|x), nats')
    right.legend(fontsize=7, ncol=2)
  return plot


def _chosen_sentence(chosen: float, rejected: float) -> str:
  """What DPO did to the chosen line's likelihood, read from its final log-ratios."""
  if chosen < 0:
    return ('The chosen line lost likelihood too: the loss only asks for the margin, and a '
            'shuffled line shares every byte with the true one, so pushing it down pulls the '
            'chosen down as well.')
  if rejected < 0:
    return 'The chosen line gained likelihood while the rejected one lost it.'
  return 'Both lines gained likelihood, the chosen more: nothing lowered the rejected one.'


def _why(numbers: dict, verdict: str, failed: list[str]) -> str:
  n = numbers
  past = ('goes past it' if n['dpo_accuracy'] > n['sft_likelihood_accuracy']
          else 'does not reach it')
  lines = [
      f"DPO (LoRA) took held-out reward accuracy from the 0.5 tie to {n['dpo_accuracy']:.3f} "
      f"(full fine-tune {n['dpo_full_accuracy']:.3f}). The SFT model's own likelihood, length-"
      f"normalised, prefers the true line in {n['sft_likelihood_accuracy']:.3f} of the pairs; "
      f"DPO's implicit reward, which starts from a tie whatever the model knows, {past}.",
      f"DPO's held-out margin h_w − h_l went {n['dpo_margins'][0]:.2f} → "
      f"{n['dpo_margins'][1]:.2f} nats from the first evaluation to the last (0 at step 0); at "
      f"the end the rejected line's log-ratio is {n['dpo_rejected']:.2f} and the chosen's "
      f"{n['dpo_chosen']:.2f} (full fine-tune: {n['dpo_full_rejected']:.2f} and "
      f"{n['dpo_full_chosen']:.2f}). " + _chosen_sentence(n['dpo_chosen'], n['dpo_rejected']),
      f"ORPO, with its SFT term, moved the chosen's log-ratio to {n['orpo_chosen']:.2f} and the "
      f"rejected's to {n['orpo_rejected']:.2f} (accuracy {n['orpo_accuracy']:.3f}); SimPO to "
      f"{n['simpo_chosen']:.2f} and {n['simpo_rejected']:.2f} (accuracy "
      f"{n['simpo_accuracy']:.3f}).",
      f"Check of the reference inside the loss: DPO's logged rewards / β equal the log-ratios "
      f"read from the probe's log-probabilities to {n['dpo_reward_vs_logps_gap']:.2g} nats.",
      f'Verdict {verdict}' + (': ' + '; '.join(f'failed: {f}' for f in failed) if failed
                              else ': every condition of `dpo.verdict` holds.')]
  return '\n\n'.join(lines)


def report(quick: bool, plan: dict, rows: dict[str, list[dict]]) -> Report:
  numbers = _numbers(plan, rows)
  verdict, failed = dpo.verdict(numbers['dpo_accuracy'], numbers['dpo_margins'],
                                numbers['dpo_chosen'], numbers['dpo_rejected'])
  summary = (f"held-out reward accuracy 0.5 → {numbers['dpo_accuracy']:.3f} (DPO, LoRA), "
             f"{numbers['dpo_full_accuracy']:.3f} (full), SimPO {numbers['simpo_accuracy']:.3f}, "
             f"ORPO {numbers['orpo_accuracy']:.3f}; DPO's rejected log-ratio "
             f"{numbers['dpo_rejected']:.2f} vs chosen {numbers['dpo_chosen']:.2f} nats")
  return Report(name=dpo.NAME, title=dpo.TITLE, paper=PAPER, claim=CLAIM,
                setting=_setting(quick, plan), verdict=verdict, summary=summary,
                why=_why(numbers, verdict, failed), tables=[_table(rows, numbers)],
                numbers={k: (list(v) if isinstance(v, tuple) else v) for k, v in numbers.items()},
                plot=_plot(rows))
