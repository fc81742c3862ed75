"""GRPO's reward functions: the two built in, what a config may name (built-ins, or modules the
user allowed), the row fields a function receives, and a function that fails at a step (raises,
the wrong number of rewards, a non-finite one) as a one-line RunFailure."""

import functools
import math
import sys
import types

import fiddle as fdl
import numpy as np
import pytest

from paxlike.errors import RunFailure, UserError
from paxlike.trainer import rewards
from paxlike.trainer.grpo_loss import GrpoLoss


def test_exact_match_compares_the_final_answer_with_the_answer_field():
  completions = ['95', ' 95 ', 'so 9+5 ... #### 14', 'steps\n14\n', '96', '']
  answers = ['95', 95, '14', '14', '95', '0']
  assert rewards.exact_match([''] * 6, completions, answers) == [1, 1, 1, 1, 0, 0]


def test_regex_format_matches_the_whole_completion():
  got = rewards.regex_format(['', '', ''], ['42', '-7 ', '4 2'])
  assert got == [1.0, 1.0, 0.0]
  tagged = functools.partial(rewards.regex_format, pattern=r'<answer>\d+</answer>')
  assert tagged(['', ''], ['<answer>3</answer>', '3']) == [1.0, 0.0]


@pytest.fixture
def user_module(monkeypatch):
  module = types.ModuleType('my_rewards')
  module.length = lambda prompts, completions: [float(len(c)) for c in completions]
  module.length.__module__ = 'my_rewards'
  monkeypatch.setitem(sys.modules, 'my_rewards', module)
  return module


def test_a_user_module_is_named_only_when_allowed(user_module):
  with pytest.raises(UserError, match='not allowed: pass --allow_import=my_rewards'):
    rewards.resolve('my_rewards.length')
  assert rewards.resolve('my_rewards.length', ['my_rewards']) is user_module.length
  assert rewards.resolve('paxlike.trainer.rewards.exact_match') is rewards.exact_match
  for name, words in [('os.system', 'not allowed'), ('paxlike.errors.UserError', 'not allowed'),
                      ('paxlike.trainer.rewards.nothing', "has no 'nothing'"), ('exact', "'module.")]:
    with pytest.raises(UserError, match=words):
      rewards.resolve(name)


def test_names_in_a_config_become_references(user_module):
  cfg = fdl.Config(GrpoLoss, reward_fns=('my_rewards.length', rewards.exact_match))
  rewards.resolve_in_config(cfg, ['my_rewards'])
  assert cfg.reward_fns == (user_module.length, rewards.exact_match)


def test_score_passes_the_fields_a_function_names_and_weights_the_sum():
  seen = {}

  def with_answer(prompts, completions, answer):
    seen['answer'] = answer
    return [1.0] * len(completions)

  def with_all(prompts, completions, **fields):
    seen['all'] = sorted(fields)
    return [2.0] * len(completions)

  total, each = rewards.score([with_answer, with_all], (0.5, 2.0), ['p', 'q'], ['a', 'b'],
                              {'answer': ['1', '2'], 'level': [3, 4]})
  assert total.tolist() == [4.5, 4.5] and sorted(each) == ['with_all', 'with_answer']
  assert seen == {'answer': ['1', '2'], 'all': ['answer', 'level']}


@pytest.mark.parametrize('fn, words', [
    (lambda p, c: 1 / 0, 'raised: ZeroDivisionError'),
    (lambda p, c: [1.0], 'returned 1 rewards for 2 completions'),
    (lambda p, c: [1.0, math.nan], r'non-finite reward \(nan\)'),
    (lambda p, c: 3.0, 'returned float, not a list of numbers'),
])
def test_a_failing_reward_function_is_a_one_line_run_failure(fn, words):
  with pytest.raises(RunFailure, match=words) as error:
    rewards.score([fn], None, ['p', 'q'], ['a', 'b'], {})
  assert '\n' not in str(error.value)


@pytest.mark.parametrize('values, words', [
    (['1.0', '2.0'], "returned str '1.0' for completion 0"),
    ([1.0, None], 'returned NoneType None for completion 1'),
    (['x', 'y'], "returned str 'x' for completion 0"),
])
def test_a_reward_function_returning_strings_or_none_is_refused_by_name(values, words):
  def picky(prompts, completions):
    return values
  with pytest.raises(UserError, match=f'reward function picky {words}') as error:
    rewards.score([picky], None, ['p', 'q'], ['a', 'b'], {})
  assert '\n' not in str(error.value)


def test_numpy_and_bool_rewards_are_numbers():
  total, _ = rewards.score([lambda p, c: np.array([1, 0]), lambda p, c: [True, np.float32(2)]],
                           None, ['p', 'q'], ['a', 'b'], {})
  assert total.tolist() == [2.0, 2.0]
