"""The grpo reproduction's pure parts: its verdict on made-up numbers (the paper's direction,
and ones that break each condition), the held-out problems kept out of the training rows,
how `--mode=decode`'s output is read back, and the curve's two ends."""

from __future__ import annotations

import sys

import pytest

from tests.helpers import REPO, assert_verdict

sys.path.insert(0, str(REPO / 'scripts'))

from reproductions import grpo, grpo_page  # noqa: E402


@pytest.mark.parametrize('sft, after, start, end, result, failed', [
    (0.829, 0.882, 0.5, 0.7, 'reproduced', None),  # The paper's GSM8K gain: +5.3 points.
    (0.50, 0.54, 0.5, 0.7, 'partly', 'by at least 0.05'),
    (0.50, 0.70, 0.5, 0.7, 'reproduced', None),
    (0.50, 0.55, 0.5, 0.7, 'reproduced', None),            # The smallest gain that counts.
    (0.50, 0.65, 0.6, 0.6, 'partly', 'ends above where it starts'),
    (0.50, 0.50, 0.5, 0.9, 'not', 'raises the held-out reward'),
    (0.50, 0.40, 0.5, 0.9, 'not', 'raises the held-out reward'),
])
def test_verdict_follows_the_claim(sft, after, start, end, result, failed):
  assert_verdict(grpo.verdict(sft, after, start, end), result, failed)


def test_held_out_problems_never_train():
  train, held = grpo.problems({'rows': 2000, 'held_out': 100})
  assert len(held) == 100 and 1800 < len(train) < 2000
  assert not {r['prompt'] for r in train} & {r['prompt'] for r in held}
  assert all(int(r['answer']) == eval(r['prompt'][:-1]) for r in held[:10])


def test_continuations_are_read_back_from_decodes_output():
  prompts = ['1+2=', '1+2=', '30+4=']
  out = '1+2=3\n9+1\n\n1+2=4\n\n\n30+4=34\n\n'  # Byte LMs run past their EOS (a newline).
  assert grpo.continuations(out, prompts) == ['3', '4', '34']


def test_the_curve_starts_at_its_first_row_and_ends_at_its_last_rows():
  rows = [{'step': s, 'reward': r} for s, r in zip(range(10, 90, 10),
                                                   [0.2, 0.3, 0.4, 0.5, 0.6, 0.6, 0.7, 0.8])]
  start, end = grpo_page.curve_ends(rows + [{'step': 80, 'eval_loss': 1.0}])
  assert start == 0.2 and end == pytest.approx((0.5 + 0.6 + 0.6 + 0.7 + 0.8) / 5)


def test_the_sft_start_is_a_copy_of_the_job_with_only_that_checkpoint(tmp_path):
  job = tmp_path / 'sft'
  for step in ('100', '200', '300'):
    (job / 'checkpoints' / step).mkdir(parents=True)
    (job / 'checkpoints' / step / 'state').write_text(step)
  (job / 'config.json').write_text('{}')
  out = grpo.at_step(job, 200, tmp_path / 'sft_start')
  assert sorted(p.name for p in (out / 'checkpoints').iterdir()) == ['200']
  assert (out / 'checkpoints' / '200' / 'state').read_text() == '200'
  assert (out / 'config.json').exists() and len(list((job / 'checkpoints').iterdir())) == 3
