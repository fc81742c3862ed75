"""Decoding stays within the positions the model attends, and says what it cut."""

import numpy as np

from paxlike.cli.decode_text import fit_context


def test_short_prompts_and_lengths_are_left_alone():
  ids, new, notes = fit_context([np.arange(5), np.arange(3)], max_len=16, max_new_tokens=12)
  assert [list(p) for p in ids] == [list(range(5)), list(range(3))] and new == 12 and not notes


def test_new_tokens_stop_where_the_longest_prompt_fills_the_context():
  ids, new, notes = fit_context([np.arange(10)], max_len=16, max_new_tokens=10_000_000)
  assert new == 7  # 10 prompt slots + 6 fed-back new tokens = 16; the 7th needs no slot.
  assert notes == ['--decode_length=10000000 is past what the model attends (max_len=16, '
                   'longest prompt 10 tokens): decoding 7 tokens']


def test_a_prompt_longer_than_the_context_keeps_its_end():
  ids, new, notes = fit_context([np.arange(40), np.arange(4)], max_len=16, max_new_tokens=5)
  assert list(ids[0]) == list(range(25, 40)) and list(ids[1]) == [0, 1, 2, 3]
  assert new == 2 and len(notes) == 2
  assert notes[0] == ('1 prompt(s) are longer than the model attends (max_len=16) and keep '
                      'their last 15 tokens (prompt 0 had 40)')
