"""The grpo reproduction's page: its text, tables and plot from the measured numbers."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from reproductions import trainer
from reproductions.page import Report

PAPER = ('Shao, Wang, Zhu, Xu, Song, Zhang, Li, Wu, Guo. *DeepSeekMath: Pushing the Limits of '
         'Mathematical Reasoning in Open Language Models*, 2024 (section 4, GRPO).')
CLAIM = """\
Group Relative Policy Optimization samples a group of G outputs per question from the current
policy, scores them (for math, by whether the final answer is right), and uses each output's
reward normalised within its group as the advantage of a PPO-style clipped objective, with a
KL penalty (the k3 estimator) to the SFT reference instead of a value model. Applied to
DeepSeekMath-Instruct 7B (the SFT model), GRPO raised GSM8K from 82.9% to 88.2% and MATH from
46.8% to 51.7% (Table 5), including on problems outside its RL training data; the training
reward climbs steadily from the SFT level (Figure 5)."""


def _setting(quick: bool, plan: dict, train_rows: int) -> str:
  size = ('`--quick`: a 1-layer model, a few steps: a smoke test of the pipeline, whose '
          'numbers mean nothing.\n\n' if quick else '')
  return size + f"""\
Theirs: DeepSeekMath-Instruct 7B, 144K GSM8K/MATH questions, G = 64 samples each, batch 1024,
learning rate 1e-6, β = 0.04 (KL), one update per sampled batch.

Ours: two-digit additions (`paxlike/data/arithmetic_synth.py`): {plan['held_out']} held-out
problems drawn first, {train_rows:,} training rows without them. `lm.ArithmeticSft` (the
2-layer d128 byte LM, {plan['sft_steps']} steps, batch 32 × 64 bytes, loss on the answer)
gives the SFT model: its step {plan['sft_start']}, short of converged so that there is room
to climb. `lm.GrpoTiny` tunes LoRA adapters (rank 8, every projection) on it
(`job:<sft dir>@{plan['sft_start']}`): 16 prompts a step, G = 8 samples each at temperature 1
(4 new tokens at most, stopping at the newline), reward 1 for the exact sum
(`rewards.exact_match`), β = 0.04, ε = 0.2, one update per batch, AdamW at lr 2e-3
(warmup-cosine), {plan['grpo_steps']} steps.
The curve is each row's mean reward over the steps since the previous row (every
{plan['log_every']}). Held out: both models continue the {plan['held_out']} held-out prompts
with `--mode=decode`, greedy and sampled at temperature 1 with seeds
{', '.join(map(str, plan['seeds']))}, scored by the same exact match."""


SIMILAR = 0.03  # Rewards closer than this count as alike (about one held-out standard error).


def _pct(value: float) -> str:
  return f'{100 * value:.1f}'


def curve_ends(rows: Sequence[dict]) -> tuple[float, float]:
  """(the first row's reward, the mean of the last TAIL rows')."""
  from reproductions.grpo import TAIL
  _, rewards = trainer.series(rows, 'reward')
  return rewards[0], sum(rewards[-TAIL:]) / len(rewards[-TAIL:])


def _plot(sft_rows, grpo_rows, levels) -> Callable[[Any], None]:
  def draw(figure) -> None:
    left, right = figure.subplots(1, 2)
    steps, rewards = trainer.series(grpo_rows, 'reward')
    left.plot(steps, rewards, marker='.', label='GRPO: mean reward of the step\'s samples')
    left.axhline(levels['sft']['sampled'], color='gray', linestyle='--',
                 label='SFT model, held out (sampled)')
    left.axhline(levels['grpo']['sampled'], color='green', linestyle=':',
                 label='GRPO model, held out (sampled)')
    left.set(xlabel='GRPO step', ylabel='reward (exact sum)', ylim=(0, 1),
             title='reward climbs from the SFT level')
    left.legend(fontsize=7)
    steps, kl = trainer.series(grpo_rows, 'kl')
    right.plot(steps, kl, marker='.', color='tab:red')
    right.set(xlabel='GRPO step', ylabel='KL to the SFT model (k3, per token)',
              title='the policy moves away from the reference')
  return draw


def _why(levels: dict, start: float, end: float, failed: list[str]) -> str:
  """What the numbers say, sentence by sentence from their signs and sizes."""
  sft, grpo = levels['sft'], levels['grpo']
  gain, greedy_gain = grpo['sampled'] - sft['sampled'], grpo['greedy'] - sft['greedy']
  text = [f"On the held-out problems the sampled reward moved {gain:+.3f} "
          f"({_pct(sft['sampled'])}% → {_pct(grpo['sampled'])}%) and the greedy one "
          f"{greedy_gain:+.3f} ({_pct(sft['greedy'])}% → {_pct(grpo['greedy'])}%); the training "
          f'curve went from {start:.3f} (its first row) to {end:.3f} (its last rows).']
  if gain > 0 and gain - greedy_gain > SIMILAR:
    text.append('The sampled reward gained more than the greedy one: GRPO mostly sharpened the '
                'distribution the SFT model has (within a group, the samples that add '
                'correctly get positive advantages), closing the gap between sampling and '
                f"greedy decoding ({_pct(sft['greedy'] - sft['sampled'])} points after SFT, "
                f"{_pct(grpo['greedy'] - grpo['sampled'])} after GRPO).")
  elif gain > 0 and greedy_gain > 0:
    text.append(f'Greedy and sampled answers gained alike (within {SIMILAR:g}): GRPO did not '
                'only sharpen the distribution the SFT model has, its most likely answer is '
                'now right on problems where it was wrong.')
  if gain > 0:
    text.append('These problems were held out of the training rows, so the gain is not '
                'memorised answers, as the paper saw outside its RL data.')
  if end - grpo['sampled'] > SIMILAR:
    text.append('The training prompts score above the held-out ones, '
                f"{start - sft['sampled']:+.3f} at the start ({start:.3f} vs "
                f"{sft['sampled']:.3f}) and "
                f"{end - grpo['sampled']:+.3f} at the end ({end:.3f} vs {grpo['sampled']:.3f}): "
                'the SFT model trained on those problems, and GRPO samples them.')
  if failed:
    text.append(f'Failed: {"; ".join(failed)}.')
  return ' '.join(text)


def report(quick: bool, plan: dict, sft_rows: list[dict], grpo_rows: list[dict],
           levels: dict, train_rows: int) -> Report:
  """The grpo page's Report."""
  from reproductions.grpo import NAME, TITLE, verdict
  start, end = curve_ends(grpo_rows)
  result, failed = verdict(levels['sft']['sampled'], levels['grpo']['sampled'], start, end)
  summary = (f"held-out reward (sampled, exact sum) {_pct(levels['sft']['sampled'])}% after "
             f"SFT → {_pct(levels['grpo']['sampled'])}% after {plan['grpo_steps']} GRPO steps "
             f"(greedy {_pct(levels['sft']['greedy'])}% → {_pct(levels['grpo']['greedy'])}%); "
             f"training reward {start:.3f} → {end:.3f}"
             + (f' (failed: {"; ".join(failed)})' if failed else '') + '.')
  steps, rewards = trainer.series(grpo_rows, 'reward')
  kl = dict(zip(*trainer.series(grpo_rows, 'kl')))
  curve = ('The training curve: each row\'s mean reward over the steps since the previous '
           'row, and the KL to the reference.', ['step', 'reward', 'KL'],
           [[s, r, kl.get(s)] for s, r in zip(steps, rewards)])
  held = ('Held-out problems (exact sum, %).', ['model', 'greedy', 'sampled (T = 1)'],
          [[name.upper(), _pct(v['greedy']), _pct(v['sampled'])] for name, v in levels.items()])
  sft_eval = [r for r in sft_rows if 'eval_loss' in r and r['step'] <= plan['sft_start']][-1]
  numbers = {'sft': levels['sft'], 'grpo': levels['grpo'], 'curve_start': round(start, 4),
             'curve_end': round(end, 4), 'sft_start_eval_loss': round(sft_eval['eval_loss'], 4),
             'failed': failed}
  return Report(NAME, TITLE, PAPER, CLAIM, _setting(quick, plan, train_rows), result, summary,
                _why(levels, start, end, failed), [held, curve], numbers,
                _plot(sft_rows, grpo_rows, levels))
